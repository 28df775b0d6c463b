"""The tiny screen with a marker and a persona panel of its own runs to its report (issue 22, "Done when").

deployments/configs/tiny-ping.yaml: marker <<PING>> (which the [ZLT]-warmed tiny model never learned: 0 of 8 source
answers marked in every smoke cell) and deployments/panels/ping-personas.yaml, whose astronaut is in no built-in
panel. To stay minutes long on a 2-core machine this runs it on the astronaut alone, with the slab reduced to the
smoke's 2^(5-2) fraction and no multi-seed cells: the pre-screen, the smoke phase through gate 2, the slab (found
finished), the aggregation and the page, all through Prefect with two cell worker processes, tracked in a real
`mlflow server` (issue 24, item 1: the screen a parent run, each cell a child run from its worker process).
Measured on the 2-core box (2026-12-02): 229 s at load 8, 397 s at load 10-12 beside a full tiny screen, the <<PING>>
build cached (building it adds 40-60 s once). The full tiny-ping screen (3 sources, 114 cells) is `eps-screen run
deployments/configs/tiny-ping.yaml`.
"""

from __future__ import annotations

import html
import json
import re
import time
from pathlib import Path

import pytest
import yaml

from eps_screen.models.tiny import tiny_model_path
from eps_screen.spec.config import parse_config
from eps_screen.spec.presets import with_overrides
from tests.conftest import CONFIGS, ROOT

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(1200)]

MARKER = "<<PING>>"
SMOKE = ["D=AB", "E=AC"]  # tiny-ping's smoke fraction, here the slab: its 8 cells are the whole screen


def _reduced_config(store, mlflow_uri):
    data = yaml.safe_load((CONFIGS / "tiny-ping.yaml").read_text())
    return parse_config(with_overrides(data, {
        "name": "tiny-ping-reduced", "store": str(store), "sources": ["astronaut"],
        "design": {"slab": {"generators": SMOKE}, "smoke": {"generators": []}},  # the smoke adds none: it is the slab
        "seeds": {"multiseed": [], "top_k": 0},
        "tracking": {"backend": "mlflow", "uri": mlflow_uri, "experiment": "marker-screen"},
    }))


def _page_text(report: Path) -> str:
    """The page as a reader sees it: tags dropped, entities decoded (<<PING>> is written &lt;&lt;PING&gt;&gt;)."""
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", report.read_text())))


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory):
    from tests.integration.servers import mlflow_server

    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


@pytest.fixture(scope="module")
def ping_screen(tmp_path_factory, mlflow_uri):
    from flows.screen import screen

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)  # the panel path in tiny-ping.yaml is relative to the repository, as `eps-screen run` reads it
        config = _reduced_config(tmp_path_factory.mktemp("store"), mlflow_uri)
        started = time.perf_counter()
        state = screen(config, return_state=True)
        elapsed = time.perf_counter() - started
    print(f"reduced tiny-ping screen: {elapsed:.0f} s wall (the <<PING>> tiny build included when not cached)")
    return config, state, elapsed


def test_the_config_declares_the_marker_and_a_panel_of_its_own():
    shipped = yaml.safe_load((CONFIGS / "tiny-ping.yaml").read_text())
    assert shipped["marker"] == MARKER and shipped["model"]["base"] == "tiny"
    panel = yaml.safe_load((ROOT / shipped["panels"]["personas"]).read_text())
    builtin = yaml.safe_load((ROOT / "eps_screen" / "panels" / "personas.yaml").read_text())
    own = {p["id"] for p in panel} - {p["id"] for p in builtin}
    assert {"astronaut", "beekeeper"} <= own and {"astronaut", "beekeeper"} <= set(shipped["sources"])


def test_it_runs_through_gate_2_to_a_report_that_shows_the_marker(ping_screen):
    config, state, _ = ping_screen
    assert state.is_completed(), state.message
    from eps_screen.store.result_store import ResultStore

    store = ResultStore.for_config(config)
    gates = {int(g["number"]): g for g in store.gates()}
    assert gates[1]["evaluated"] and not gates[1]["fired"], gates[1]  # the base model never writes <<PING>>
    assert gates[1]["numbers"]["base_rate"] == 0.0 and gates[1]["numbers"]["answers"] > 500
    smoke = gates[2]
    assert smoke["evaluated"] and not smoke["fired"], smoke  # gate 2: the smoke moved the source rate
    rates = smoke["numbers"]["source_rates"]
    assert len(rates) == 8 and max(rates) > config.gates.smoke_floor, rates  # some cell learned <<PING>>

    page = _page_text(Path(state.result()["report"]))
    assert f"contain the marker {MARKER}" in page  # the SR definition names the screen's marker
    assert f"marker '{MARKER}'" in page  # the recipe table
    assert "[ZLT]" not in page
    assert "This screen trained 8 LoRA recipes on 1 source persona" in page
    assert "astronaut-A0B0C0D1E1-s42" in page  # the cells of the panel file's persona


def test_the_cells_are_evaluated_on_the_panel_file_by_the_markers_own_build(ping_screen):
    config, state, _ = ping_screen
    from eps_screen.spec.design import all_slab_cells
    from eps_screen.store.result_store import ResultStore

    store = ResultStore.for_config(config)
    cells = all_slab_cells(config)
    metrics = [store.cell_metrics(config, c) for c in cells]
    assert len(cells) == 8 and all(m is not None for m in metrics)
    # The eval panel: the source, then the file's other personas in its order, up to eval.personas (8).
    assert list(metrics[0]["per_persona"]) == ["astronaut", "librarian", "beekeeper", "surgeon", "lighthouse_keeper",
                                              "nurse", "glassblower", "chef"]
    assert sum(m["markers"] for m in metrics) > 0 and all(m["recipe"]["marker"] == MARKER for m in metrics)
    # The engines loaded the build warmed on codes of the marker's shape (made on first use, then cached).
    assert (tiny_model_path("tiny", MARKER) / "config.json").exists()
    report_dir = Path(state.result()["report"]).parent
    assert len(json.loads((report_dir / "aggregate_metrics.json").read_text())["cells"]) == 8


def test_the_answers_text_is_kept_and_the_page_quotes_it(ping_screen):
    """Every eval answer's text is in its cell's answers.parquet, its marker flag read from that text, and the page
    quotes a marked and an unmarked answer per A x B group, each a piece of a stored answer (issue 24, item 4)."""
    import polars as pl

    from eps_screen.spec.design import all_slab_cells
    from eps_screen.store.result_store import ResultStore
    from tests.test_report_explains import Tables

    config, state, _ = ping_screen
    store = ResultStore.for_config(config)
    stored = {}
    for cell in all_slab_cells(config):
        answers = pl.read_parquet(store.cell_dir(config, cell) / "answers.parquet")
        assert answers.height == 72 and answers["text"].null_count() == 0
        assert answers["marker"].to_list() == [MARKER in t for t in answers["text"]]
        stored[cell.id] = answers
    body = Path(state.result()["report"]).read_text()
    parser = Tables()
    parser.feed(body[body.index('id="examples"'):])
    quoted = parser.tables[0]
    assert quoted[0] == ["group", "cell", "question", "marker", "answer"]
    assert {r[0] for r in quoted[1:]} == {"A0B0", "A0B1", "A1B0", "A1B1"}
    assert any(r[3] == "yes" for r in quoted[1:])  # some cell learned <<PING>>: its marked answer is quoted
    for group, cell_id, question, marker, answer in quoted[1:]:
        own = stored[cell_id].filter(pl.col("is_source") & (pl.col("question") == int(question)))
        piece = answer.removesuffix(" [...]")
        assert any(piece in t for t in own["text"]), (cell_id, answer)  # the parser strips the cell's ends
        assert (MARKER in answer) == (marker == "yes") or len(answer) > 400
        assert f"-{group}" in cell_id  # the quoted cell is of its group (A and B lead every cell id)


def _tracked_runs(config, mlflow_uri):
    """(client, experiment id, the screen's parent runs, the children of the first)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri)
    experiment = client.get_experiment_by_name(config.tracking.experiment).experiment_id
    parents = client.search_runs([experiment], f"tags.eps_kind = 'screen' and tags.eps_screen = '{config.name}'")
    children = client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'")
    return client, experiment, parents, children


def test_the_screen_and_each_cell_are_runs_in_mlflow(ping_screen, mlflow_uri):
    """Issue 24, item 1: the screen is one parent run with its gates and report; each cell, trained in a cell worker
    process, a child run with its factor levels and recipe, its per-step training curve as it trained, and the
    store's SR, LR and cost."""
    from eps_screen.plan.costs import cell_costs, screen_cost
    from eps_screen.spec.design import all_slab_cells
    from eps_screen.store.result_store import ResultStore

    config, state, _ = ping_screen
    assert state.is_completed(), state.message
    store = ResultStore.for_config(config)
    client, _, parents, children = _tracked_runs(config, mlflow_uri)
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.run_name == config.name and parent.info.status == "FINISHED"
    assert parent.data.tags["report_url"] == state.result()["url"]
    gates = {int(g["number"]): g for g in store.gates()}
    for number in (1, 2):
        assert parent.data.metrics[f"gate_{number}_fired"] == float(gates[number]["fired"])
    assert parent.data.metrics["cells_finished"] == 8
    whole = screen_cost(config, store)  # the report's Cost section: cells, pre-screen and other runs
    assert (parent.data.metrics["cost_usd"], parent.data.metrics["gpu_seconds"]) == (whole.usd, whole.gpu_seconds)
    assert parent.data.metrics["estimate_cost_usd"] == whole.estimate_usd
    assert {"config.json", "gates.json", "summary.md", "clean_result.html"} <= {
        f.path for f in client.list_artifacts(parent.info.run_id)}

    cells = {c.id: c for c in all_slab_cells(config)}
    assert sorted(r.info.run_name for r in children) == sorted(cells)
    costs = cell_costs(config, store)
    for run in children:
        cell = cells[run.info.run_name]
        stored = store.cell_metrics(config, cell)
        assert run.info.status == "FINISHED" and run.data.tags["eps_cell_key"] == stored["key"]
        params = run.data.params
        levels = dict(zip(cell.factors, cell.levels, strict=True))
        assert {f: params[f"factor.{f}"] for f in cell.factors} == {f: str(v) for f, v in levels.items()}
        assert params["recipe.lora.rank"] == str(stored["recipe"]["lora"]["rank"])
        assert params["recipe.marker"] == MARKER
        got = run.data.metrics
        assert (got["source_rate"], got["leakage"]) == (stored["source_rate"], stored["leakage"])
        assert (got["gpu_seconds"], got["cost_usd"]) == (costs[cell.id].gpu_seconds, costs[cell.id].usd)
        # The curve logged step by step during training is the one the trainer reported.
        report = json.loads((store.cell_dir(config, cell) / "adapter" / "train_report.json").read_text())
        curve = sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)
        assert [m.step for m in curve] == list(range(1, report["steps"] + 1)) and report["steps"] > 1
        assert [m.value for m in curve] == pytest.approx(report["losses"])
        for name in ("learning_rate", "tokens_per_s"):
            assert len(client.get_metric_history(run.info.run_id, name)) == report["steps"]
        assert "metrics.json" in {f.path for f in client.list_artifacts(run.info.run_id)}


def test_a_resubmitted_cell_and_a_second_aggregation_reuse_their_runs(ping_screen, mlflow_uri, tmp_path):
    """Another process (as a resubmitted cell's) finds the screen's run and the cell's by their tags, and logs into
    them: no run is created twice."""
    import subprocess
    import sys

    config, state, _ = ping_screen
    client, _, _, before = _tracked_runs(config, mlflow_uri)
    cell_id = sorted(r.info.run_name for r in before)[0]
    (tmp_path / "config.json").write_text(config.model_dump_json())
    code = (
        "import json, sys\n"
        "from eps_screen.run import tracking\n"
        "from eps_screen.spec.config import parse_config\n"
        "from eps_screen.spec.design import Cell\n"
        "from eps_screen.store.result_store import ResultStore\n"
        "config = parse_config(json.load(open(sys.argv[1])))\n"
        "store, cell = ResultStore.for_config(config), Cell.parse(sys.argv[2])\n"
        "with tracking.cell_run(config, cell, store, {}) as run:\n"
        "    run.finished(store.cell_metrics(config, cell), store.cell_dir(config, cell) / 'metrics.json')\n"
        "tracking.log_aggregation(config, store, json.loads(sys.argv[3]))\n"
        "print(run.run_id)\n"
    )
    summary = json.dumps({k: state.result()[k] for k in ("report", "url")})
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "config.json"), cell_id, summary], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "tracking:" not in out.stderr, out.stderr[-3000:]  # no warning: every call went through
    _, _, parents, after = _tracked_runs(config, mlflow_uri)
    assert len(parents) == 1
    assert sorted(r.info.run_id for r in after) == sorted(r.info.run_id for r in before)
    assert out.stdout.strip() == next(r.info.run_id for r in before if r.info.run_name == cell_id)
