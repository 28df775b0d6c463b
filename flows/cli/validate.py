"""`eps-screen validate CONFIG`: check a config and print the plan (no Prefect)."""

from __future__ import annotations

import json
import sys

from eps_screen.analysis.power import Assumptions
from eps_screen.analysis.power import lines as power_lines
from eps_screen.models.packaged import weights_of
from eps_screen.plan.cost_estimate import at_gpu_counts, off_policy_choices
from eps_screen.plan.screen_plan import make_plan
from eps_screen.spec.config import read_config_file
from eps_screen.spec.config_profiles import profile_line, with_profile
from eps_screen.store.result_store import ResultStore, ScreenNotFound, load_screen
from flows.cli.session import load


def run(args) -> int:
    config = load(args.config)
    print(f"{args.config}: valid screen '{config.name}' (model {config.model.base}, sources {', '.join(config.sources)})")
    _, profile, filled = with_profile(read_config_file(args.config))
    if (line := profile_line(profile, filled)):
        print(f"  {line}")
    print(f"  weights: {weights_of(config)}")
    plan = make_plan(config)
    for line in plan.lines():
        print(f"  {line}")
        if line.startswith("wall clock:"):
            print(f"  {gpu_counts_line(config, plan.work)}")
            if (choices := off_policy_line(config, plan.work)):
                print(f"  {choices}")
    try:
        assumptions = _assumptions(config, getattr(args, "like", None), getattr(args, "store", None))
    except (ScreenNotFound, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in power_lines(config, assumptions):
        print(f"  {line}")
    for line in plan.problems:
        print(f"error: {line}", file=sys.stderr)
    return 2 if plan.problems else 0


def _assumptions(config, like: str | None, store: str | None) -> Assumptions:
    """design.power's, or those of an earlier screen's results (--like)."""
    if like is None:
        return Assumptions.of(config)
    earlier = load_screen(store or config.store, like)
    path = ResultStore.for_config(earlier).report_dir / "main_effects.json"
    if not path.is_file():
        raise ValueError(f"--like {like}: the screen has no results yet ({path} is missing); aggregate it first, or"
                         " drop --like")
    return Assumptions.like(config, json.loads(path.read_text()), like)


def gpu_counts_line(config, work) -> str:
    """GPU-hours against wall clock for 1 to 8 GPUs at once, so that a user choosing execution.max_parallel_cells
    sees what the extra start-ups buy."""
    parts = [f"{n} -> {e.gpu_hours:.1f} h GPU / {e.wall_hours:.1f} h wall"
             for n, e in at_gpu_counts(config, work=work).items()]
    return f"GPUs at once: {', '.join(parts)} (each with the cells_per_job that gives it the fewest jobs)"


def off_policy_line(config, work) -> str | None:
    """What the off-policy answer sets' other ways would make the screen, where a local model's engine makes them."""
    choices = off_policy_choices(config, work)
    if not choices:
        return None
    parts = [f"{what} -> {e.gpu_hours:.1f} h GPU (answer sets {e.hours['regimes']:.2f})" for what, e in choices.items()]
    return f"off-policy answers, other ways: {', '.join(parts)}"
