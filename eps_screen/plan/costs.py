"""What a screen cost: GPU-seconds and dollars per cell and per screen, from the pods' recorded prices.

Where the figures come from. The RunPod worker publishes one record per pod (price x time, gpu_count) on the job's
flow run; the screen's dispatch (flows/runtime/ledger.py) reads them as it prices each finished run and saves one
*run cost* per flow run in the store (`ResultStore.save_run_cost`, <screen>/costs/<flow run id>.json), already
split among the run's cells by `split_run`. Everything below reads only those records, so the report, `status`,
`eps-screen results` and a resumed screen (whose earlier runs' records stay in the store) agree.

`priced_from` says how a figure is known:
  pod        the worker's published pod records (price x the pod's own clock)
  estimate   no pod record came (a pool without the RunPod worker, or none within the ledger's wait): the run's
             seconds as dispatch timed them x `execution.gpu_hourly_usd`, one GPU
  inprocess  the cell ran in the screen's own process (the CPU): costs nothing, shown as $0
  none       a finished cell with no cost record (finished before costs were recorded, or its run not yet priced)

The split rule (`split_run`) is stated there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eps_screen.plan import screen_plan as plan_mod
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import PRE_SCREEN_ID, Cell
from eps_screen.store.result_store import ResultStore, cell_key

PRICED_FROM = ("pod", "estimate", "inprocess", "none")
# The parts of a cell's metrics `timings` that are its own time on the card. Under execution.job_eval=per_job a
# job's shared training and evaluation passes are already apportioned into train_s/eval_s (eps_screen/run/pipeline.py),
# while total_s spans the whole shared stretch and so overlaps the other cells' (summing it would double count).
_OWN_PARTS = ("answers_s", "train_s", "eval_s", "score_s", "store_s")


@dataclass(frozen=True)
class CellCost:
    """One cell's share of the GPU time and money its job(s) cost. Every run that held the cell counts: a job
    resubmitted after its pod vanished cost twice, and both pods' shares are the cell's."""

    gpu_seconds: float
    usd: float
    priced_from: str  # one of PRICED_FROM; "estimate" where any of its runs was estimated
    runs: int = 0  # flow runs whose cost includes a share of this cell

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0


@dataclass
class ScreenCost:
    """A screen's actual cost beside the plan's estimate (GPU-hours and USD)."""

    gpu_seconds: float
    usd: float
    cells: dict[str, CellCost]  # every finished cell of the current config
    pre_screen: CellCost  # the pre-screen's run(s) on a GPU pool; zeros in-process
    other: CellCost  # what no finished current cell holds: a changed recipe's old cells, cells never finished
    by_phase: dict[str, CellCost]  # smoke, fold_over, slab (its cells not in the smoke phase), multiseed
    runs: int  # priced flow runs
    estimate_gpu_hours: float | None
    estimate_usd: float | None
    priced_from: dict[str, int] = field(default_factory=dict)  # how many finished cells each way

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0

    def as_dict(self) -> dict:
        def one(c: CellCost) -> dict:
            return {"gpu_hours": round(c.gpu_hours, 6), "usd": round(c.usd, 6), "priced_from": c.priced_from,
                    "runs": c.runs}

        return {"gpu_hours": round(self.gpu_hours, 6), "usd": round(self.usd, 6), "runs": self.runs,
                "estimate_gpu_hours": self.estimate_gpu_hours, "estimate_usd": self.estimate_usd,
                "pre_screen": one(self.pre_screen), "other": one(self.other),
                "by_phase": {k: one(v) for k, v in self.by_phase.items()}, "priced_from": dict(self.priced_from)}


def own_seconds(timings: dict | None) -> float:
    """A cell's own seconds on the card, from its metrics `timings` (see _OWN_PARTS)."""
    timings = timings or {}
    if "job_train_s" in timings or "job_eval_s" in timings:
        return float(sum(timings.get(k, 0.0) for k in _OWN_PARTS))
    return float(timings.get("total_s", 0.0) or sum(timings.get(k, 0.0) for k in _OWN_PARTS))


def split_run(cell_ids: list[str], pod_seconds: float, seconds: dict[str, float | None]) -> dict[str, float]:
    """Each cell's fraction of one run's cost (the fractions sum to 1): the split rule.

    A pod's bill is its wall time; a job's wall time is (a) each cell's own work, recorded in its metrics
    `timings`, and (b) what every cell of the job shares: the pod's start-up, the image and model loads, the
    regimes' answer generation, the engine's start. (a) goes to the cell that used it: a cell that trained for
    ten minutes costs more than one that trained for one. (b) has no owner, so it is spread evenly among the cells
    the run computed: each would have needed it alone.

    `seconds` maps each cell the run computed to its own seconds (`own_seconds`); a cell the run found finished
    (None, or absent) gets nothing: it cost this pod only a store read. When the recorded seconds add up to more
    than the pod's (a clock mismatch), the pod is split in proportion to them. A run with no computed cell (it
    crashed, its pod vanished, or its summaries were lost) is split evenly among all the job's cells: they are the
    cells that pod was rented for.
    """
    if not cell_ids:
        raise ValueError("cell_ids is empty: a run's cost needs at least one cell to go to")
    own = {c: max(0.0, float(s)) for c, s in seconds.items() if c in cell_ids and s is not None}
    if not own:
        return {c: 1.0 / len(cell_ids) for c in cell_ids}
    work = sum(own.values())
    pod = max(0.0, float(pod_seconds))
    out = dict.fromkeys(cell_ids, 0.0)
    if pod <= 0.0 or work > pod:
        for c, s in own.items():
            out[c] = s / work if work else 1.0 / len(own)
        return out
    shared = (pod - work) / len(own)
    for c, s in own.items():
        out[c] = (s + shared) / pod
    return out


def run_cost_record(*, flow_run_id: str, state: str, pool: str, cell_ids: list[str],
                    summaries: dict[str, dict], keys: dict[str, str | None], pods: list[dict] | None,
                    run_seconds: float, hourly_usd: float) -> dict:
    """The store's record of one flow run's cost, split among its cells (`split_run`).

    `pods` are the worker's published pod records (each with seconds, gpu_count, usd); None prices the run as an
    estimate from `run_seconds` x `hourly_usd` on one GPU. `summaries` are the job flow's summaries of the cells
    this run completed ({} for a run that did not complete); `keys` each cell's store key (None for the
    pre-screen), so a cell whose recipe changed later is not charged to its new key.
    """
    seconds = {c: (None if s.get("reused") or s.get("result_missing") else own_seconds(s.get("timings")))
               for c, s in summaries.items() if c != PRE_SCREEN_ID}
    if PRE_SCREEN_ID in summaries:  # no timings of its own: it takes its even share of the shared time
        seconds[PRE_SCREEN_ID] = 0.0
    return _record(flow_run_id, state, pool, list(cell_ids), seconds, keys, pods, run_seconds, hourly_usd)


def repriced(record: dict, pods: list[dict]) -> dict:
    """A run's record, first stored as an estimate, priced again from its pods' records (same cells, same split
    inputs)."""
    cells = record["cells"]
    return _record(record["flow_run_id"], record["state"], record["pool"], list(cells),
                   {c: v.get("own_seconds") for c, v in cells.items()}, {c: v.get("key") for c, v in cells.items()},
                   pods, record["pod_seconds"], 0.0)


def _record(flow_run_id: str, state: str, pool: str, cell_ids: list[str], seconds: dict[str, float | None],
            keys: dict[str, str | None], pods: list[dict] | None, run_seconds: float, hourly_usd: float) -> dict:
    for i, pod in enumerate(pods or []):
        missing = [k for k in ("seconds", "usd") if not isinstance(pod.get(k), int | float)]
        if missing:
            raise ValueError(f"pods[{i}].{missing[0]}: a pod cost record needs a number there, got {pod.get(missing[0])!r}")
    if pods:
        pod_seconds = sum(float(p["seconds"]) for p in pods)
        gpu_seconds = sum(float(p["seconds"]) * int(p.get("gpu_count") or 1) for p in pods)
        usd = sum(float(p["usd"]) for p in pods)
        priced_from = "pod"
    else:
        pod_seconds = gpu_seconds = max(0.0, float(run_seconds))
        usd = pod_seconds * hourly_usd / 3600.0
        priced_from = "estimate"
    shares = split_run(cell_ids, pod_seconds, seconds)
    return {
        "flow_run_id": flow_run_id, "state": state, "pool": pool, "priced_from": priced_from,
        "pod_seconds": round(pod_seconds, 3), "gpu_seconds": round(gpu_seconds, 3), "usd": round(usd, 6),
        # what the worker measured, without the account (a name on a billing account is nobody else's business)
        "pods": [{k: p.get(k) for k in ("pod_id", "gpu_type", "cloud", "gpu_count", "usd_per_hour", "seconds", "usd")}
                 for p in pods or []],
        "cells": {c: {"key": keys.get(c), "share": share, "own_seconds": seconds.get(c),
                      "gpu_seconds": gpu_seconds * share, "usd": usd * share} for c, share in shares.items()},
    }


def _add(a: CellCost | None, gpu_seconds: float, usd: float, priced_from: str) -> CellCost:
    if a is None or a.priced_from in ("none", "inprocess"):
        return CellCost(gpu_seconds, usd, priced_from, 1)
    worst = "estimate" if "estimate" in (a.priced_from, priced_from) else a.priced_from
    return CellCost(a.gpu_seconds + gpu_seconds, a.usd + usd, worst, a.runs + 1)


def _sum(costs: list[CellCost], empty: str) -> CellCost:
    if not costs:
        return CellCost(0.0, 0.0, empty, 0)
    kinds = {c.priced_from for c in costs}
    kind = next(k for k in ("estimate", "none", "pod", "inprocess") if k in kinds)
    return CellCost(sum(c.gpu_seconds for c in costs), sum(c.usd for c in costs), kind, sum(c.runs for c in costs))


def charges(records: list[dict]) -> dict[tuple[str, str | None], CellCost]:
    """Every run record's shares summed per (cell id, store key): what `eps-screen results` shows per row (a
    cell's earlier recipe, under its own key, keeps its own cost)."""
    out: dict[tuple[str, str | None], CellCost] = {}
    for record in records:
        for cell_id, part in record.get("cells", {}).items():
            key = (cell_id, part.get("key"))
            out[key] = _add(out.get(key), float(part["gpu_seconds"]), float(part["usd"]), record["priced_from"])
    return out


def _charged(config: ScreenConfig, store: ResultStore) -> tuple[dict[str, CellCost], CellCost, CellCost, int]:
    """Every run record of the screen, charged to (current cells by id, the pre-screen, the rest)."""
    by_cell: dict[str, CellCost] = {}
    pre: CellCost | None = None
    other: CellCost | None = None
    records = store.run_costs()
    current: dict[str, str] = {}
    for record in records:
        for cell_id, part in record.get("cells", {}).items():
            gpu_s, usd, kind = float(part["gpu_seconds"]), float(part["usd"]), record["priced_from"]
            if cell_id == PRE_SCREEN_ID:
                pre = _add(pre, gpu_s, usd, kind)
                continue
            if cell_id not in current:
                try:
                    current[cell_id] = cell_key(config, Cell.parse(cell_id))
                except ValueError as exc:
                    raise ValueError(f"costs/{record.get('flow_run_id')}.json: cells.{cell_id}: {exc}") from exc
            if part.get("key") == current[cell_id]:
                by_cell[cell_id] = _add(by_cell.get(cell_id), gpu_s, usd, kind)
            else:
                other = _add(other, gpu_s, usd, kind)
    zero = "inprocess" if config.execution.pool == "inprocess" else "none"
    return by_cell, pre or CellCost(0.0, 0.0, zero, 0), other or CellCost(0.0, 0.0, zero, 0), len(records)


def cell_costs(config: ScreenConfig, store: ResultStore) -> dict[str, CellCost]:
    """{cell id: CellCost} for every finished cell of the config (every phase's, as far as they are known).

    A cell with no cost record is $0: `inprocess` when the screen runs in-process (the CPU costs nothing),
    `none` on a GPU pool (its run was never priced, or finished before costs were recorded)."""
    charged, _, _, _ = _charged(config, store)
    zero = CellCost(0.0, 0.0, "inprocess" if config.execution.pool == "inprocess" else "none", 0)
    with store.listing():
        finished = store.finished(config, plan_mod.expected_cells(config, store))
    return {c.id: charged.get(c.id, zero) for c in finished}


def screen_cost(config: ScreenConfig, store: ResultStore, estimate: dict | None = None) -> ScreenCost:
    """The screen's actual cost (every priced run of it: cells, pre-screen, and runs for no current cell) beside
    `estimate` (a plan's `estimate`, {gpu_hours, cost_usd}; computed from the config when not given)."""
    charged, pre, other, runs = _charged(config, store)
    zero = CellCost(0.0, 0.0, "inprocess" if config.execution.pool == "inprocess" else "none", 0)
    cells: dict[str, CellCost] = {}
    by_phase: dict[str, CellCost] = {}
    with store.listing():  # one listing of a URL store, not a request per cell (the multi-seed pick reads many)
        phases = plan_mod.phase_cells(config, store)
        for phase in ("smoke", "fold_over", "slab", "multiseed"):
            mine = [c for c in phases[phase] if c.id not in cells and store.is_finished(config, c)]
            for c in mine:
                cells[c.id] = charged.get(c.id, zero)
            if mine:  # a phase with no finished cell of its own (the slab's smoke cells count as smoke) has no row
                by_phase[phase] = _sum([cells[c.id] for c in mine], zero.priced_from)
    if estimate is None:
        from eps_screen.plan.cost_estimate import estimate as estimate_of

        estimate = estimate_of(config).as_dict()
    # a current cell charged but not finished (its runs crashed, the screen stopped) was still paid for
    paid = [c for c in (other, *(c for cell_id, c in charged.items() if cell_id not in cells)) if c.runs]
    other = _sum(paid, other.priced_from) if paid else other
    kinds: dict[str, int] = {}
    for c in cells.values():
        kinds[c.priced_from] = kinds.get(c.priced_from, 0) + 1
    parts = [*cells.values(), pre, other]
    return ScreenCost(
        gpu_seconds=sum(c.gpu_seconds for c in parts), usd=sum(c.usd for c in parts), cells=cells,
        pre_screen=pre, other=other, by_phase=by_phase, runs=runs,
        # a CPU estimate's hours are the in-process run's wall time, not hours of a rented GPU
        estimate_gpu_hours=0.0 if estimate.get("hardware") == "CPU" else estimate.get("gpu_hours"),
        estimate_usd=estimate.get("cost_usd"), priced_from=kinds)


# ---------------------------------------------------------------- the estimate-vs-actual rows every view shows

COST_HEADERS = ("what", "GPU-hours est.", "GPU-hours actual", "USD est.", "USD actual", "priced from")
_PHASE_NAMES = {"smoke": "phase 1 smoke", "fold_over": "phase 1b fold-over", "slab": "phase 2 slabs",
                "multiseed": "phase 3 multi-seed"}


def cost_rows(cost: dict) -> list[tuple[str, str, str, str, str, str]]:
    """The table of a `ScreenCost.as_dict()`, as text: the screen (estimate beside actual), then the pre-screen,
    each phase's cells and the rest (actual only: the plan estimates the screen as a whole). The report, `status`
    and the screen run's summary artifact show these same rows."""
    def hours(x: float | None) -> str:
        return "—" if x is None else f"{x:,.3f}"

    def usd(x: float | None) -> str:
        return "—" if x is None else f"${x:,.2f}"

    def row(what: str, part: dict) -> tuple:
        return (what, "—", hours(part["gpu_hours"]), "—", usd(part["usd"]), part["priced_from"])

    kinds = ", ".join(f"{n} cell(s) {k}" for k, n in sorted(cost.get("priced_from", {}).items())) or "no cell yet"
    rows = [("screen", hours(cost.get("estimate_gpu_hours")), hours(cost["gpu_hours"]),
             usd(cost.get("estimate_usd")), usd(cost["usd"]), f"{cost['runs']} run(s); {kinds}")]
    if cost["pre_screen"]["runs"]:
        rows.append(row("phase 0 pre-screen", cost["pre_screen"]))
    rows += [row(_PHASE_NAMES.get(name, name), part) for name, part in cost.get("by_phase", {}).items()]
    if cost["other"]["runs"] or cost["other"]["usd"]:
        rows.append(row("other runs (old recipes, unfinished cells)", cost["other"]))
    return rows


def cost_sentence(cost: dict) -> str:
    """One line: actual beside the estimate, and how the actual is known."""
    kinds = cost.get("priced_from", {})
    if not cost["runs"] and kinds and set(kinds) == {"inprocess"}:
        return "In-process on this machine's CPU: no GPU was rented, so every cell and the screen cost $0.00."
    est = cost.get("estimate_usd")
    vs = "" if est is None else f" against an estimate of ${est:,.2f} ({cost.get('estimate_gpu_hours') or 0:,.3f} GPU-h)"
    return (f"Spent ${cost['usd']:,.2f} over {cost['gpu_hours']:,.3f} GPU-hours{vs}, from the pods' recorded prices "
            "(price x time) where the RunPod worker published them, split among each job's cells by their recorded "
            "seconds with the job's start-up shared evenly (eps_screen/plan/costs.py); in-process cells cost $0.")
