"""What the GPU tier's equivalence tests share: qwen7b.yaml's LoRA on the 7B shape in bf16, and the distance they
state their tolerances in."""

from __future__ import annotations


def config(**training):
    """r=32 / alpha 64 on all linear layers, bf16, batch 8, 2 epochs, packed, lr 1e-4 (to move the adapters in a
    few steps); `training` sets the rest."""
    from eps_screen.spec.config import ScreenConfig

    base = ScreenConfig()
    t = base.training.model_copy(update={"epochs": 2, "batch_size": 8, "learning_rate": 1e-4, "packing": True,
                                         "liger": False, **training})
    return base.model_copy(update={"training": t, "model": base.model.model_copy(update={"dtype": "bfloat16"}),
                                   "lora": base.lora.model_copy(update={"rank": 32, "alpha": 64})})


def rel(a, b) -> float:
    """Relative Frobenius distance of tensor a from b."""
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30))
