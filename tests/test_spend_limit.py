"""Kill criterion 5 holds a GPU pool's spend to the plan's price, and a plan priced at $0 sets no limit."""

from __future__ import annotations

from eps_screen.plan.screen_plan import make_plan
from eps_screen.spec.config import load_config
from flows.screen import spend_limit
from tests.conftest import ROOT

CONFIGS = ROOT / "deployments" / "configs"


def test_a_plan_priced_at_zero_sets_no_spend_limit():
    tiny = load_config(CONFIGS / "tiny.yaml")
    on_gpu_pool = tiny.model_copy(update={"execution": tiny.execution.model_copy(update={"pool": "local-gpu"})})
    plan = make_plan(on_gpu_pool)
    assert plan.estimate.get("cost_usd", 0) == 0  # CPU-hours: nothing to hold spend to
    assert spend_limit(plan) is None


def test_a_priced_plan_is_the_spend_limit():
    plan = make_plan(load_config(CONFIGS / "qwen7b.yaml"))
    assert spend_limit(plan) == plan.estimate["cost_usd"] > 0
