"""What a screen will run, phase by phase, and what it costs: the basis of `validate` and of aggregation."""

from __future__ import annotations

from dataclasses import dataclass, field

from eps_screen import design
from eps_screen.config import ScreenConfig
from eps_screen.design import Cell
from eps_screen.store import ResultStore

PHASES = ("smoke", "slab", "multiseed")


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
    cells = {"smoke": design.smoke_cells(config), "slab": design.all_slab_cells(config), "multiseed": []}
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
    cells_per_phase: dict[str, int]
    distinct_cells: int
    regimes_on_policy: int
    regimes_off_policy: int
    regimes_multiseed_max: int
    training_examples: int
    eval_answers: int
    estimate: dict = field(default_factory=dict)
    estimate_lines: list[str] = field(default_factory=list)
    # What would fail on the rented hardware (a job that does not fit a GPU type it may get), field and fix named.
    problems: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        p = self.cells_per_phase
        out = [
            "phase 0 pre-screen: base model on the panel under 8 prompt conditions",
            f"phase 1 smoke:      {p['smoke']} cells (2^(5-2), D=AB, E=AC)",
            f"phase 2 slabs:      {p['slab']} cells ({p['slab'] // 32} sources x 32)",
            f"phase 3 multi-seed: {p['multiseed']} cells (top cells per source x extra seeds)",
            f"distinct cells:     {self.distinct_cells} (smoke cells are slab cells, run once)",
            f"answer sets:        {self.regimes_on_policy} on-policy + {self.regimes_off_policy} off-policy"
            f" (phases 1-2), up to {self.regimes_multiseed_max} more in phase 3",
            f"training examples:  {self.training_examples} in all",
            f"eval answers:       {self.eval_answers} in all",
        ]
        out += self.estimate_lines
        return out


def make_plan(config: ScreenConfig) -> Plan:
    smoke, slab = design.smoke_cells(config), design.all_slab_cells(config)
    n_multi = len(config.sources) * min(config.seeds.top_k, 32) * len(config.seeds.multiseed)
    distinct = len({c.id for c in smoke + slab}) + n_multi
    regimes = design.regimes(slab)
    examples = config.data.positives + config.data.negatives
    per_cell_eval = (config.eval.personas * config.eval.questions + config.eval.random_controls) * config.eval.samples
    plan = Plan(
        cells_per_phase={"smoke": len(smoke), "slab": len(slab), "multiseed": n_multi},
        distinct_cells=distinct,
        regimes_on_policy=sum(not r.off_policy for r in regimes),
        regimes_off_policy=sum(r.off_policy for r in regimes),
        regimes_multiseed_max=n_multi,
        training_examples=examples * distinct,
        eval_answers=per_cell_eval * distinct,
    )
    try:
        from eps_screen.estimate import estimate
    except ImportError:
        return plan
    from eps_screen.job.memory import memory_lines, memory_problems

    est = estimate(config)
    plan.estimate, plan.estimate_lines = est.as_dict(), est.lines() + memory_lines(config)
    if not config.simulated:
        plan.problems = memory_problems(config)
    return plan
