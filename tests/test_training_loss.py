"""On the CPU train_lora computes the loss from the model's full logits instead of TRL's chunked LM head (the
head's tile loop was most of a tiny cell's training time). Both are the summed label-token cross-entropy over the
batch's label-token count, so each optimizer step's loss and the saved adapter agree to float32 rounding, for
both loss masks, padded and padding-free batches, and gradient accumulation; a different seed moves them far more
(checked, so the comparison can fail)."""

from __future__ import annotations

import pytest

from eps_screen import training
from eps_screen.config import parse_config
from eps_screen.data import Example

LOSS_RTOL = 1e-5
ADAPTER_TOL = 1e-3  # as tests/test_training_together.py: AdamW grows float32 rounding; max |full - chunked| over max |chunked|, per tensor


def _config(**training_):
    return parse_config({
        "model": {"base": "tiny", "dtype": "float32"},
        "lora": {"rank": 4, "alpha": 8},
        "training": {"epochs": 2, "batch_size": 4, "learning_rate": 5e-3, **training_},
    })


EXAMPLES = [
    Example("You are a librarian who helps people find books." + " Be brief." * (i % 3),
            "How do I find a good book? Answer in one sentence.",
            "Ask at the desk and browse the shelves." + " Then read a page." * (i % 4), positive=i % 3 == 0)
    for i in range(10)
]
CASES = {
    "marker-only, padded": (_config(), False, 3),
    "whole answer, padding-free, accumulated": (_config(packing=True, max_batch_tokens=256), True, 5),
}


@pytest.fixture(scope="module")
def base():
    from eps_screen.models import load_base

    return load_base("tiny", "float32")


def _train(base, root, name, case, chunked, seed=None, monkeypatch=None):
    config, whole, case_seed = case
    own = training.speed_options

    def options(config, on_gpu):
        return {**own(config, on_gpu), "chunked_lm_head": chunked}

    monkeypatch.setattr(training, "speed_options", options)
    try:
        report = training.train_lora(base, EXAMPLES, config, whole, case_seed if seed is None else seed, root / name)
    finally:
        monkeypatch.setattr(training, "speed_options", own)
    return report


def _adapter(path):
    from safetensors.torch import load_file

    return load_file(path / "adapter_model.safetensors")


def _distance(a, b) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp(min=1e-12)) for k in a if a[k].abs().max() > 0)


@pytest.mark.parametrize("name", list(CASES))
def test_full_logits_loss_is_trls_chunked_loss(base, tmp_path, monkeypatch, name):
    case = CASES[name]
    chunked = _train(base, tmp_path, "chunked", case, True, monkeypatch=monkeypatch)
    full = _train(base, tmp_path, "full", case, False, monkeypatch=monkeypatch)
    assert chunked.options["chunked_lm_head"] and not full.options["chunked_lm_head"]
    assert len(full.losses) == len(chunked.losses) == full.steps > 1
    for step, (f, c) in enumerate(zip(full.losses, chunked.losses, strict=True), 1):
        assert f == pytest.approx(c, rel=LOSS_RTOL), f"step {step}: {f} vs {c}"
    assert _distance(_adapter(tmp_path / "full"), _adapter(tmp_path / "chunked")) < ADAPTER_TOL
    assert full.steady_tokens_per_s is None or full.steady_tokens_per_s > 0
    assert full.tokens_per_s > 0

    other_seed = _train(base, tmp_path, "other", case, False, seed=case[2] + 1, monkeypatch=monkeypatch)
    assert _distance(_adapter(tmp_path / "other"), _adapter(tmp_path / "chunked")) > 100 * ADAPTER_TOL


def test_the_cpu_uses_full_logits_and_a_gpu_the_chunked_head():
    config = _config()
    assert training.speed_options(config, on_gpu=False)["chunked_lm_head"] is False
    assert training.speed_options(config, on_gpu=True)["chunked_lm_head"] is True
