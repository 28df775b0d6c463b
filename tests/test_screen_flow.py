"""The walking skeleton end to end on the tiny model: all five phases through Prefect, then a re-run.

One full tiny screen per session (module-scoped fixture); the other tests read its store.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from eps_screen.spec import design
from eps_screen.spec.design import Cell, all_slab_cells
from tests.conftest import tiny_config

# The whole tiny screen runs in the module fixture: minutes on an idle 2-core machine, more on a busy one.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(2700)]


def _mtimes(store_dir: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in store_dir.rglob("*") if p.is_file() and "report" not in p.parts}


GENERATE_CALLS: list[tuple[int, str | None]] = []


@pytest.fixture(scope="module")
def tiny_screen(tmp_path_factory):
    """The whole tiny screen, once. Training-answer generation and the pre-screen run in this process (cells
    run in worker processes), so wrapping the generator here counts every generation of training answers."""
    from eps_screen.generation.transformers_backend import TransformersGenerator
    from flows.screen import screen

    original = TransformersGenerator.generate

    def counting(self, prompts, params, adapter=None):
        GENERATE_CALLS.append((len(prompts), adapter))
        return original(self, prompts, params, adapter)

    store = tmp_path_factory.mktemp("store")
    config = tiny_config(store)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TransformersGenerator, "generate", counting)
        started = time.perf_counter()
        state = screen(config, return_state=True)
        elapsed = time.perf_counter() - started
    return config, state, store / config.name, elapsed


def test_all_phases_run_and_the_report_shows_every_cell(tiny_screen):
    config, state, screen_dir, elapsed = tiny_screen
    assert state.is_completed(), state.message
    result = state.result()
    report = Path(result["report"])
    assert report.name == "clean_result.html" and report.exists()
    for name in ("main_effects.json", "interactions.json", "aggregate_metrics.json"):
        assert (report.parent / name).exists()
    phases = {p.stem for p in (screen_dir / "phases").glob("*.json")}
    assert {"pre_screen", "smoke", "multiseed", "gates"} <= phases
    assert {f"slab-{s}" for s in config.sources} <= phases
    metrics = json.loads((report.parent / "aggregate_metrics.json").read_text())
    cells = {c["cell_id"]: c for c in metrics["cells"]}
    assert len(cells) == 96 + 18  # every slab cell plus the multi-seed re-runs
    html = report.read_text()
    for cell in all_slab_cells(config)[:5]:
        assert cell.id in html  # per-cell source rate and leakage are in the page
    print(f"tiny screen wall time: {elapsed:.0f} s")


def test_training_answers_are_generated_once_per_regime(tiny_screen):
    """8 on-policy generations per source for the 32 slab cells (not 32), each shared by both E levels."""
    config, _, screen_dir, _ = tiny_screen
    cells = [Cell.parse(p.parent.name) for p in screen_dir.glob("cells/*/*")]
    regimes = set(design.regimes(config, cells))
    on_policy_primary = {r for r in regimes if not r.off_policy and r.seed == config.seeds.primary}
    assert len(on_policy_primary) == 8 * len(config.sources)
    # The generate calls of this process: one per regime (training answers) + 8 pre-screen conditions.
    assert len(GENERATE_CALLS) == len(regimes) + 8
    assert all(adapter is None for _, adapter in GENERATE_CALLS)
    assert len(list(screen_dir.glob("regimes/*/*/meta.json"))) == len(regimes)


def test_numbers_come_from_trained_adapters(tiny_screen):
    config, _, screen_dir, _ = tiny_screen
    metrics = [json.loads(p.read_text()) for p in screen_dir.glob("cells/*/*/metrics.json")]
    assert len(metrics) == 96 + 18
    for m in metrics:
        assert Path(m["adapter"], "adapter_model.safetensors").exists()
        assert m["train"]["steps"] > 0 and m["answers"] > 0
    # Not a constant: the recipe factors move the source rate.
    assert len({round(m["source_rate"], 3) for m in metrics}) > 3


def test_second_run_recomputes_nothing(tiny_screen):
    from flows.screen import screen

    config, _, screen_dir, first = tiny_screen
    before = _mtimes(screen_dir)
    started = time.perf_counter()
    state = screen(config, return_state=True)
    elapsed = time.perf_counter() - started
    assert state.is_completed()
    after = _mtimes(screen_dir)
    changed = [p for p, t in after.items() if p in before and t != before[p] and not p.endswith("gates.json")]
    new = [p for p in after if p not in before and "/cells/" in p]
    assert changed == [] or all("phases" in p or "screen.json" in p for p in changed), changed
    assert new == []
    print(f"second run: {elapsed:.1f} s (first {first:.0f} s)")
    assert elapsed < first / 3


def test_contaminated_base_stops_the_screen_at_the_pre_screen(tmp_path):
    from flows.screen import screen

    config = tiny_config(tmp_path, model={"base": "tiny-contaminated", "dtype": "float32"})
    state = screen(config, return_state=True)
    assert state.is_failed() and state.name == "Killed"
    assert "kill criterion 1" in state.message and "contamination" in state.message
    assert not (tmp_path / config.name / "cells").exists()  # phase 1 never started
    gates = json.loads((tmp_path / config.name / "phases" / "gates.json").read_text())
    assert gates["1"]["fired"] is True
