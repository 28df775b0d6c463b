"""Cost as an output (issue 24, item 2): the split of a run's pod cost among its cells, and the store's records.

The store here holds simulated cells written straight through the pipeline (seconds, no Prefect); the run cost
records are written as the dispatch writes them (flows/runtime/ledger.py), from pod records shaped like the
RunPod worker's (infra/eps_screen_runpod/cost.py). The fake-RunPod screen (tests/integration/test_runpod_pool.py)
checks the same figures against pods the real worker priced.
"""

from __future__ import annotations

import pytest

from eps_screen.plan.costs import (
    CellCost,
    cell_costs,
    cost_sentence,
    own_seconds,
    run_cost_record,
    screen_cost,
    split_run,
)
from eps_screen.run import pipeline
from eps_screen.spec import design
from eps_screen.spec.design import PRE_SCREEN_ID
from eps_screen.store.result_store import ResultStore, cell_key
from tests.conftest import tiny_config

SIMULATED = {"generation": "simulated", "training": "simulated"}


def pod(pod_id: str, seconds: float, usd_per_hour: float, gpu_count: int = 1) -> dict:
    return {"pod_id": pod_id, "account": "main", "gpu_type": "NVIDIA H200", "cloud": "SECURE", "gpu_count": gpu_count,
            "usd_per_hour": usd_per_hour, "seconds": seconds, "usd": usd_per_hour * seconds / 3600}


def test_own_work_goes_to_its_cell_and_the_shared_start_up_is_spread_evenly():
    # a 100 s pod: cell a worked 30 s, b 10 s, c was found finished; 60 s of start-up shared by a and b
    shares = split_run(["a", "b", "c"], 100.0, {"a": 30.0, "b": 10.0, "c": None})
    assert shares == pytest.approx({"a": (30 + 30) / 100, "b": (10 + 30) / 100, "c": 0.0})
    assert sum(shares.values()) == pytest.approx(1.0)


def test_a_run_that_computed_nothing_is_split_evenly_and_clocks_that_disagree_split_by_work():
    assert split_run(["a", "b", "c", "d"], 50.0, {}) == pytest.approx(dict.fromkeys("abcd", 0.25))
    # the cells' recorded seconds exceed the pod's own clock: in proportion to them, never a negative share
    assert split_run(["a", "b"], 10.0, {"a": 30.0, "b": 10.0}) == pytest.approx({"a": 0.75, "b": 0.25})
    with pytest.raises(ValueError, match="cell_ids"):
        split_run([], 10.0, {})


def test_own_seconds_never_counts_a_shared_pass_twice():
    # per_job: total_s spans the job's shared passes; the apportioned parts are the cell's own
    shared = {"answers_s": 1.0, "train_s": 20.0, "eval_s": 5.0, "score_s": 0.5, "total_s": 300.0,
              "job_train_s": 160.0, "job_eval_s": 40.0}
    assert own_seconds(shared) == pytest.approx(26.5)
    assert own_seconds({"train_s": 20.0, "eval_s": 5.0, "total_s": 27.0}) == 27.0  # per_cell: sequential
    assert own_seconds(None) == 0.0


def test_a_record_prices_its_pods_and_gpu_seconds_count_every_gpu():
    summaries = {"a": {"timings": {"total_s": 30.0}}, "b": {"timings": {"total_s": 10.0}},
                 "c": {"timings": {"total_s": 99.0}, "reused": True}}
    record = run_cost_record(flow_run_id="run-1", state="Completed", pool="runpod-gpu", cell_ids=["a", "b", "c"],
                             summaries=summaries, keys=dict.fromkeys("abc", "k"),
                             pods=[pod("p1", 100.0, 7.2, gpu_count=2)], run_seconds=90.0, hourly_usd=3.5)
    assert record["priced_from"] == "pod" and record["usd"] == pytest.approx(0.2)
    assert record["gpu_seconds"] == pytest.approx(200.0)  # pod seconds x gpu_count
    assert {c: v["usd"] for c, v in record["cells"].items()} == pytest.approx({"a": 0.12, "b": 0.08, "c": 0.0})
    assert {c: v["gpu_seconds"] for c, v in record["cells"].items()} == pytest.approx({"a": 120, "b": 80, "c": 0})
    assert "account" not in str(record["pods"])
    # no pod record: the run's own seconds at the configured hourly rate, one GPU
    guess = run_cost_record(flow_run_id="run-2", state="Crashed", pool="local-gpu", cell_ids=["a", "b"],
                            summaries={}, keys={}, pods=None, run_seconds=360.0, hourly_usd=3.5)
    assert guess["priced_from"] == "estimate" and guess["usd"] == pytest.approx(0.35)
    assert {c: v["usd"] for c, v in guess["cells"].items()} == pytest.approx({"a": 0.175, "b": 0.175})


@pytest.fixture
def priced_store(tmp_path):
    config = tiny_config(tmp_path, name="costs", backend=SIMULATED, execution={"pool": "runpod-gpu"})
    store = ResultStore.for_config(config)
    cells = design.smoke_cells(config)[:3]
    for cell in cells:
        pipeline.run_cell(config, cell, store)
    a, b, c = (x.id for x in cells)
    keys = {x.id: cell_key(config, x) for x in cells}
    # job 1 (a, b) crashed on its first pod, completed on its second; job 2 (c) and the pre-screen one pod each
    records = [
        run_cost_record(flow_run_id="r1", state="Crashed", pool="runpod-gpu", cell_ids=[a, b], summaries={}, keys=keys,
                        pods=[pod("p1", 40.0, 3.6)], run_seconds=41.0, hourly_usd=3.5),
        run_cost_record(flow_run_id="r2", state="Completed", pool="runpod-gpu", cell_ids=[a, b],
                        summaries={a: {"timings": {"total_s": 50.0}}, b: {"timings": {"total_s": 10.0}}},
                        keys=keys, pods=[pod("p2", 100.0, 3.6)], run_seconds=101.0, hourly_usd=3.5),
        run_cost_record(flow_run_id="r3", state="Completed", pool="runpod-gpu", cell_ids=[c],
                        summaries={c: {"timings": {"total_s": 5.0}}}, keys=keys, pods=[pod("p3", 20.0, 7.2, 2)],
                        run_seconds=21.0, hourly_usd=3.5),
        run_cost_record(flow_run_id="r4", state="Completed", pool="runpod-gpu", cell_ids=[PRE_SCREEN_ID],
                        summaries={PRE_SCREEN_ID: {}}, keys={PRE_SCREEN_ID: None}, pods=[pod("p4", 30.0, 3.6)],
                        run_seconds=31.0, hourly_usd=3.5),
    ]
    for record in records:
        store.save_run_cost(record)
    store.save_run_cost(records[1])  # a run priced twice is one record
    return config, store, (a, b, c)


def test_cell_costs_sum_every_run_that_held_the_cell(priced_store):
    config, store, (a, b, c) = priced_store
    costs = cell_costs(config, store)
    # r1: $0.04 evenly; r2: $0.10 as (50+20)/100 and (10+20)/100; r3: $0.04 on 2 GPUs
    assert costs[a] == CellCost(pytest.approx(20 + 70), pytest.approx(0.02 + 0.07), "pod", 2)
    assert costs[b] == CellCost(pytest.approx(20 + 30), pytest.approx(0.02 + 0.03), "pod", 2)
    assert costs[c] == CellCost(pytest.approx(40.0), pytest.approx(0.04), "pod", 1)
    assert len(costs) == 3  # only finished cells


def test_the_screen_total_is_every_pod_once_beside_the_estimate(priced_store):
    config, store, _ = priced_store
    total = screen_cost(config, store, {"gpu_hours": 0.5, "cost_usd": 1.75})
    assert total.usd == pytest.approx(0.04 + 0.10 + 0.04 + 0.03) and total.runs == 4
    assert total.gpu_seconds == pytest.approx(40 + 100 + 40 + 30)
    assert total.pre_screen.usd == pytest.approx(0.03) and total.other.usd == pytest.approx(0.0)
    assert total.by_phase["smoke"].usd == pytest.approx(0.18)
    assert (total.estimate_gpu_hours, total.estimate_usd) == (0.5, 1.75)
    assert total.priced_from == {"pod": 3}


def test_in_process_cells_cost_zero_and_say_so(tmp_path):
    config = tiny_config(tmp_path, name="cpu", backend=SIMULATED)
    store = ResultStore.for_config(config)
    cell = design.smoke_cells(config)[0]
    pipeline.run_cell(config, cell, store)
    assert cell_costs(config, store) == {cell.id: CellCost(0.0, 0.0, "inprocess", 0)}
    total = screen_cost(config, store)
    assert total.usd == 0.0
    assert total.estimate_gpu_hours == 0.0  # the plan's CPU hours are wall time, not a rented GPU's
    assert cost_sentence(total.as_dict()).startswith("In-process on this machine's CPU: no GPU was rented")


def test_the_report_status_and_summary_show_estimate_beside_actual(priced_store):
    import io

    from rich.console import Console

    from eps_screen.run.aggregate import aggregate_stored
    from flows.aggregate import _summary_markdown
    from flows.runtime.status import render, screen_status

    config, store, _ = priced_store
    _, result = aggregate_stored(config, store)
    cost = result.metrics.extras["cost"]
    assert cost["usd"] == pytest.approx(0.21) and cost["estimate_usd"] == pytest.approx(screen_cost(config, store).estimate_usd)
    page = (store.report_dir / "clean_result.html").read_text()
    assert '<h2 id="cost">Cost</h2>' in page and "$0.21" in page and "phase 0 pre-screen" in page
    markdown = _summary_markdown(config, result, "http://x/report", 10, str(store.dir))
    assert "**Cost.** Spent $0.21" in markdown and "| screen |" in markdown
    out = io.StringIO()
    render(screen_status(config, store, with_prefect=False), Console(file=out, width=200))
    assert "cost (estimate vs actual" in out.getvalue() and "$0.21" in out.getvalue()


def test_bad_records_name_the_field_or_the_file(priced_store):
    with pytest.raises(ValueError, match=r"pods\[0\]\.usd"):
        run_cost_record(flow_run_id="r", state="Completed", pool="runpod-gpu", cell_ids=["a"], summaries={}, keys={},
                        pods=[{"pod_id": "p", "seconds": 3.0, "usd": None}], run_seconds=3.0, hourly_usd=1.0)
    config, store, _ = priced_store
    with pytest.raises(ValueError, match="flow_run_id"):
        store.save_run_cost({"flow_run_id": "../x"})
    (store.dir / "costs" / "broken.json").write_text("{not json")
    before = cell_costs(config, store)  # a record that will not parse is kept aside, not a failed report
    assert not (store.dir / "costs" / "broken.json").exists()
    assert [p.name.split(".bad-")[0] for p in (store.dir / "costs").glob("broken.json.bad-*")] == ["broken.json"]
    assert cell_costs(config, store) == before
