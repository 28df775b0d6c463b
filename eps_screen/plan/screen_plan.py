"""What a screen will run, phase by phase, and what it costs: the basis of `validate` and of aggregation."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from eps_screen.plan.cost_estimate import estimate
from eps_screen.plan.memory import memory_lines, memory_problems
from eps_screen.plan.screen_work import ScreenWork, screen_work
from eps_screen.spec import design
from eps_screen.spec.centre_points import centre_recipe
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import Cell
from eps_screen.store.result_store import ResultStore

PHASES = ("smoke", "slab", "multiseed")  # the fold-over (design.fold_over) runs beside the smoke phase


def multiseed_pick(config: ScreenConfig, store: ResultStore) -> list[Cell] | None:
    """The phase-3 cells, picked from the finished slab results; None until every slab cell is finished."""
    slabs = design.all_slab_cells(config)
    rates = {}
    for cell in slabs:
        metrics = store.cell_metrics(config, cell)
        if metrics is None:
            return None
        rates[cell] = metrics["source_rate"]
    top = {s: design.pick_top(rates, s, config.seeds.top_k) for s in config.sources}
    return design.multiseed_cells(config, top)


def phase_cells(config: ScreenConfig, store: ResultStore | None = None) -> dict[str, list[Cell]]:
    cells = {"smoke": design.smoke_cells(config), "fold_over": design.fold_over_cells(config),
             "slab": design.all_slab_cells(config), "multiseed": []}
    if store is not None:
        cells["multiseed"] = multiseed_pick(config, store) or []
    return cells


def expected_cells(config: ScreenConfig, store: ResultStore) -> list[Cell]:
    """Every distinct cell the screen needs, as far as it is known (phase 3 only once slabs are done)."""
    seen: dict[str, Cell] = {}
    for cells in phase_cells(config, store).values():
        for c in cells:
            seen.setdefault(c.id, c)
    return list(seen.values())


@dataclass
class Plan:
    designs: design.PhaseDesigns
    work: ScreenWork
    pre_screen_conditions: int
    cells_per_phase: dict[str, int]
    distinct_cells: int
    regimes_on_policy: int
    regimes_off_policy: int
    regimes_multiseed_max: int
    training_examples: int
    eval_answers: int
    estimate: dict = field(default_factory=dict)
    estimate_lines: list[str] = field(default_factory=list)
    centre_recipe: list[tuple[str, str]] = field(default_factory=list)  # centre_points.centre_recipe
    # What would fail on the rented hardware (a job that does not fit a GPU type it may get), field and fix named.
    problems: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        p, d = self.cells_per_phase, self.designs
        n = self.pre_screen_conditions
        per_slab = len(d.slab.runs())
        out = [
            f"phase 0 pre-screen: base model on the panel under {n} condition{'s' if n != 1 else ''}",
            f"phase 1 smoke:      {p['smoke']} cells ({d.smoke.describe()})",
        ]
        if d.fold_over is not None:
            out.append(f"  fold-over:        {p['fold_over']} cells ({d.fold_over.describe()})")
        design_cells = p["slab"] - p["centre"]
        out += [
            (f"phase 2 slabs:      {design_cells} cells ({design_cells // per_slab} sources x {per_slab}"
             f"{'' if per_slab == 2 ** d.slab.k else ', ' + d.slab.describe()})"),
            *self.centre_lines(),
            f"phase 3 multi-seed: {p['multiseed']} cells (top cells per source x extra seeds)",
            f"distinct cells:     {self.distinct_cells} (smoke cells are slab cells, run once)",
            (f"answer sets:        {self.regimes_on_policy} on-policy + {self.regimes_off_policy} off-policy"
             f" (phases 1-2), up to {self.regimes_multiseed_max} more in phase 3"),
            f"training examples:  {self.training_examples} in all",
            f"eval answers:       {self.eval_answers} in all",
        ]
        out += self.estimate_lines
        return out

    def centre_lines(self) -> list[str]:
        """The centre cells beside the slab (design.centre_points): how many, at which seeds, and their recipe."""
        n = self.cells_per_phase["centre"]
        if not n:
            return []
        seeds = sorted({c.seed for c in self.work.slab if c.is_centre})
        per = n // max(1, len({c.source for c in self.work.slab if c.is_centre}))
        return [f"  centre points:    {n} cells ({n // per} sources x {per}, seeds {seeds[0]}-{seeds[-1]}: the curvature"
                " test, not in the effects), at " + "; ".join(f"{f} {what}" for f, what in self.centre_recipe)]


# Plans built in this process, by config: the CLI's plan is the screen flow's (which takes only the config, as a
# deployment's run does). A few: a process plans one screen, tests and validate's comparisons a handful.
_PLANS: OrderedDict[str, Plan] = OrderedDict()
_KEPT = 8


def make_plan(config: ScreenConfig) -> Plan:
    """The plan of a screen, built once per process and config (not to be changed by its users)."""
    key = config.model_dump_json()
    if key not in _PLANS:
        _PLANS[key] = _make_plan(config)
        while len(_PLANS) > _KEPT:
            _PLANS.popitem(last=False)
    return _PLANS[key]


def _make_plan(config: ScreenConfig) -> Plan:
    """The work counted once (screen_work), priced (estimate) and checked against the cards' memory."""
    work = screen_work(config)
    plan = Plan(
        designs=design.phases(config),
        work=work,
        pre_screen_conditions=len(work.pre_screen),
        cells_per_phase=work.cells_per_phase,
        distinct_cells=work.distinct_cells,
        regimes_on_policy=sum(not r.off_policy for r in work.regimes),
        regimes_off_policy=sum(r.off_policy for r in work.regimes),
        regimes_multiseed_max=work.n_multi,
        training_examples=work.examples_per_cell * work.distinct_cells,
        eval_answers=work.answers_per_cell * work.distinct_cells,
    )
    if config.design.centre_points:
        plan.centre_recipe = centre_recipe(config)
    est = estimate(config, work)
    plan.estimate, plan.estimate_lines = est.as_dict(), est.lines() + memory_lines(config)
    if not config.simulated:
        plan.problems = memory_problems(config)
    return plan
