"""The optional fold-over phase (design.fold_over) on the simulated backend: after the smoke, the smoke fraction
with every level flipped, whose cells with the smoke's de-alias the main effects from the two-factor interactions.

The simulation plants a large A x B interaction; the marker screen's smoke fraction has D = AB, so the smoke alone
reads A x B into D's effect, and smoke plus fold-over does not."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import yaml

from tests.conftest import CONFIGS

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    from eps_screen.spec.config import parse_config
    from flows.screen import screen

    data = yaml.safe_load((CONFIGS / "simulated.yaml").read_text())
    store = tmp_path_factory.mktemp("store")
    data["design"] = {"smoke": {"generators": ["D=AB", "E=AC"]}, "fold_over": True}
    data.update(name="fold", store=str(store), sources=["librarian", "surgeon"],
                eval={"personas": 4, "questions": 20, "samples": 10, "random_controls": 2},
                seeds={"multiseed": [137], "top_k": 1}, bootstrap={"resamples": 200})
    config = parse_config(data)
    state = screen(config, return_state=True)
    with get_client(sync_client=True) as client:
        subflows = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[state.state_details.flow_run_id])))
    return config, state, subflows


def _rates(config, cells):
    from eps_screen.store.result_store import ResultStore

    store = ResultStore.for_config(config)
    return np.array([store.cell_metrics(config, c)["source_rate"] for c in cells])


def _effect(cells, rates, factor) -> float:
    x = np.array([c.level(factor) for c in cells])
    return float(rates[x == 1].mean() - rates[x == 0].mean())


def test_the_fold_over_runs_after_the_smoke_and_before_the_slabs(run):
    _, state, subflows = run
    assert state.is_completed(), state.message
    started = {r.name: r.start_time for r in subflows}
    assert started["phase 1: smoke"] < started["phase 1b: fold-over"] < started["phase 2: slabs"]
    assert {r.name: r.state.type.value for r in subflows}["phase 1b: fold-over"] == "COMPLETED"


def test_its_cells_are_the_smoke_cells_with_every_level_flipped(run):
    from eps_screen.spec import design
    from eps_screen.store.result_store import ResultStore

    config, *_ = run
    smoke, folded = design.smoke_cells(config), design.fold_over_cells(config)
    assert {c.levels for c in folded} == {tuple(1 - x for x in c.levels) for c in smoke}
    assert {c.source for c in folded} == {config.smoke}
    assert {c.id for c in folded} <= {c.id for c in design.slab_cells(config, config.smoke)}
    record = ResultStore.for_config(config).phase("fold-over")
    assert sorted(record["cells"]) == sorted(c.id for c in folded)
    # Smoke and fold-over together: every main-effect column is orthogonal to every two-factor interaction column.
    both = smoke + folded
    coded = {f: np.array([2 * c.level(f) - 1 for c in both]) for f in config.design.shorts}
    for f, (g, h) in itertools.product(config.design.shorts, itertools.combinations(config.design.shorts, 2)):
        assert coded[f] @ (coded[g] * coded[h]) == 0, (f, g, h)


def test_together_they_take_the_planted_interaction_out_of_a_main_effect(run):
    from eps_screen.spec import design
    from eps_screen.store.result_store import ResultStore

    config, *_ = run
    smoke, folded = design.smoke_cells(config), design.fold_over_cells(config)
    planted = config.simulation.effects
    assert planted["AB"] <= -0.8 and planted["D"] == -0.4  # D = AB in the smoke: it reads D + AB
    smoke_d = _effect(smoke, _rates(config, smoke), "D")
    both = smoke + folded
    clear = ResultStore.for_config(config).phase("fold-over")["main_effects"]["SR"]
    assert clear["D"] == pytest.approx(_effect(both, _rates(config, both), "D"))
    assert smoke_d < 2 * clear["D"] < 0  # the smoke's D carries A x B (same sign), the clear D does not
    assert clear["A"] > 0 and clear["B"] < 0 and clear["E"] < 0  # the planted signs
