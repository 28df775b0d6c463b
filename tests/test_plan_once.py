"""A screen's plan and its cells' store keys are each worked out once per process, not per caller."""

from __future__ import annotations

from eps_screen.plan import screen_plan as plan_module
from eps_screen.plan.phase_sizes import distinct_cells
from eps_screen.plan.screen_plan import make_plan
from eps_screen.spec import design
from eps_screen.spec.config import load_config
from eps_screen.store.result_store import cell_key, regime_key
from tests.conftest import CONFIGS


def test_the_plan_is_built_once_per_config(monkeypatch):
    built = []
    real = plan_module._make_plan
    monkeypatch.setattr(plan_module, "_PLANS", type(plan_module._PLANS)())
    monkeypatch.setattr(plan_module, "_make_plan", lambda c: built.append(c.name) or real(c))
    config = load_config(CONFIGS / "tiny.yaml")
    first = make_plan(config)
    # the CLI's plan is the screen flow's: the same config, however copied, gives the same plan
    assert make_plan(config.model_copy()) is first and make_plan(load_config(CONFIGS / "tiny.yaml")) is first
    assert built == ["tiny"]
    other = make_plan(config.with_sets({"training.epochs": config.training.epochs + 1}))
    assert other is not first and built == ["tiny", "tiny"]
    assert other.estimate["work"]["training_tokens"] > first.estimate["work"]["training_tokens"]
    # the aggregation's count, without a plan, is the plan's
    assert distinct_cells(config) == first.distinct_cells == len(first.work.cells) + first.work.n_multi

def test_a_cells_key_resolves_its_recipe_once(monkeypatch):
    config = load_config(CONFIGS / "tiny.yaml")
    cell = design.all_slab_cells(config)[5]
    regime = design.regime_of(config, cell)
    calls = []
    for name in ("recipe", "regime_recipe"):
        real = getattr(design, name)
        monkeypatch.setattr(design, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    keys = {cell_key(config, cell) for _ in range(9)}, {regime_key(config, regime) for _ in range(9)}
    assert list(map(len, keys)) == [1, 1] and calls == ["recipe", "regime_recipe"]
    # another config (another recipe) is another key, resolved for it
    other = config.with_sets({"training.epochs": config.training.epochs + 1})
    assert cell_key(other, cell) not in keys[0] and calls.count("recipe") == 2
