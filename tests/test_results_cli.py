"""`eps-screen results` (issue 24, item 3): one table over every screen of a store, read back with polars.

The store holds two simulated screens written straight through the pipeline (seconds, no Prefect): tiny.yaml's
2^5 (factors A-E, 96 slab cells) and sim-6-2.yaml's 2^(6-2) (A-F, 48 cells), and the first screen's recipe is
then changed and two of its cells run again, so the same cell ids stand under two keys.
"""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import polars as pl
import pytest

from eps_screen.run import pipeline
from eps_screen.spec import design
from eps_screen.spec.config import ScreenConfig, load_config
from eps_screen.store.result_store import ResultStore
from flows.cli import main
from tests.conftest import CONFIGS, tiny_config

SIMULATED = {"generation": "simulated", "training": "simulated"}


def _run(config: ScreenConfig, cells) -> ResultStore:
    store = ResultStore.for_config(config)
    store.save_screen({"config": config.model_dump(mode="json"), "provenance": {}})
    for cell in cells:
        pipeline.run_cell(config, cell, store)
    return store


@pytest.fixture(scope="module")
def two_screens(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-screens")
    tiny = tiny_config(root, name="tiny-sim", backend=SIMULATED)
    tiny_cells = design.all_slab_cells(tiny)
    _run(tiny, tiny_cells)
    data = load_config(CONFIGS / "sim-6-2.yaml").model_dump(mode="json")
    sim = ScreenConfig.model_validate({**data, "name": "sim62", "store": str(root)})
    sim_cells = design.all_slab_cells(sim)
    _run(sim, sim_cells)
    # the recipe changes (a cell input): the earlier cells stay under their keys, two cells run under new ones
    changed = tiny.model_copy(update={"training": tiny.training.model_copy(update={"learning_rate": 3e-4})})
    rerun = _run(changed, tiny_cells[:2])
    return root, tiny, tiny_cells, sim, sim_cells, rerun


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["results", *argv])
    return code, out.getvalue(), err.getvalue()


def test_the_parquet_holds_every_finished_cell_of_both_screens(two_screens, tmp_path):
    root, tiny, tiny_cells, sim, sim_cells, rerun = two_screens
    path = tmp_path / "cells.parquet"
    code, _, err = _cli("--store", str(root), "--format", "parquet", "--output", str(path))
    assert code == 0 and f"{len(tiny_cells) + 2 + len(sim_cells)} cells of 2 screen(s)" in err
    table = pl.read_parquet(path)
    assert table.group_by("screen").len().sort("screen").rows() == [("sim62", 48), ("tiny-sim", 98)]
    assert {"A", "B", "C", "D", "E", "F"} <= set(table.columns)
    assert table.filter(pl.col("screen") == "tiny-sim")["F"].null_count() == 98  # tiny.yaml has no factor F
    assert table.filter(pl.col("screen") == "sim62")["F"].null_count() == 0
    # every row is its cell's metrics.json: rates, seed and levels as the store holds them
    for config, cell in ((sim, sim_cells[5]), (tiny, tiny_cells[40])):
        metrics = ResultStore.for_config(config).cell_metrics(config, cell)
        row = table.filter((pl.col("screen") == config.name) & (pl.col("cell_id") == cell.id)).row(0, named=True)
        assert (row["source_rate"], row["leakage"], row["seed"], row["key"]) == (
            metrics["source_rate"], metrics["leakage"], cell.seed, metrics["key"])
        assert all(row[f] == cell.level(f) for f in cell.factors)
        assert row["current"] is True or config is tiny
    # the two re-run cells: one row per key, only the new recipe's current
    again = table.filter(pl.col("cell_id").is_in([c.id for c in tiny_cells[:2]]))
    assert again.height == 4 and again["current"].sum() == 2 and again["key"].n_unique() == 4
    assert table.filter(pl.col("screen") == "tiny-sim")["current"].sum() == 2


def test_where_filters_with_sql_and_csv_reads_back(two_screens):
    root, *_ = two_screens
    code, out, _ = _cli("--store", str(root), "--where", "F = 1 AND source_rate >= 0", "--format", "csv")
    assert code == 0
    table = pl.read_csv(io.StringIO(out))
    assert set(table["screen"]) == {"sim62"} and table.height == 24 and set(table["F"]) == {1}
    code, out, _ = _cli("--store", str(root), "--screen", "tiny-sim", "--where", "current")
    assert code == 0 and out.count("tiny-sim") == 2


@pytest.mark.parametrize("argv, says", [
    (("--where", "rank > 8"), "is not an SQL condition over the columns (screen, cell_id"),
    (("--screen", "nope"), "no screen 'nope' in store"),
    (("--format", "parquet"), "give it --output FILE"),
])
def test_bad_arguments_name_the_fix(two_screens, argv, says):
    root, *_ = two_screens
    code, out, err = _cli("--store", str(root), *argv)
    assert code == 2 and says in err and not out


def test_cost_columns_are_each_rows_share_of_its_priced_runs_and_zero_in_process(two_screens, tmp_path):
    from eps_screen.plan.costs import run_cost_record
    from eps_screen.store.result_store import cell_key

    root, tiny, tiny_cells, sim, sim_cells, rerun = two_screens
    # sim62 as though it ran on RunPod: one $0.36 job of two cells (100 s pod on 2 GPUs), cell 0 worked 60 s, 1 20 s
    a, b = sim_cells[0], sim_cells[1]
    pod = {"pod_id": "p1", "gpu_type": "NVIDIA H200", "cloud": "SECURE", "gpu_count": 2, "usd_per_hour": 12.96,
           "seconds": 100.0, "usd": 0.36}
    record = run_cost_record(flow_run_id="run-results-1", state="Completed", pool="runpod-gpu",
                             cell_ids=[a.id, b.id], keys={c.id: cell_key(sim, c) for c in (a, b)},
                             summaries={a.id: {"timings": {"total_s": 60.0}}, b.id: {"timings": {"total_s": 20.0}}},
                             pods=[pod], run_seconds=101.0, hourly_usd=3.5)
    store = ResultStore.for_config(sim)
    store.save_run_cost(record)
    try:
        path = tmp_path / "cells.parquet"
        assert _cli("--store", str(root), "--format", "parquet", "--output", str(path))[0] == 0
        table = pl.read_parquet(path)
        rows = {r["cell_id"]: r for r in table.filter(pl.col("screen") == "sim62").iter_rows(named=True)}
        assert rows[a.id]["cost_usd"] == pytest.approx(0.36 * 0.7) and rows[b.id]["cost_usd"] == pytest.approx(0.36 * 0.3)
        assert rows[a.id]["gpu_seconds"] == pytest.approx(200 * 0.7)
        # in-process cells: $0 and 0 GPU-seconds, shown, not null
        others = table.filter(~pl.col("cell_id").is_in([a.id, b.id]))
        assert others["cost_usd"].null_count() == 0 and others["cost_usd"].sum() == 0.0
        code, out, _ = _cli("--store", str(root), "--where", "cost_usd > 0", "--format", "csv")
        assert code == 0 and sorted(pl.read_csv(io.StringIO(out))["cell_id"]) == sorted([a.id, b.id])
    finally:
        (store.dir / "costs" / "run-results-1.json").unlink()
