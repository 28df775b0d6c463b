"""On the CPU train_lora computes the loss from the model's full logits instead of TRL's chunked LM head (the
head's tile loop was most of a tiny cell's training time). Both are the summed label-token cross-entropy over the
batch's label-token count, so each optimizer step's loss and the saved adapter agree to float32 rounding, for
both loss masks, padded and padding-free batches, and gradient accumulation; a different seed moves them far more
(checked, so the comparison can fail)."""

from __future__ import annotations

import pytest

from eps_screen.spec.config import parse_config
from eps_screen.train import lora as training
from eps_screen.train.data import Example

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
    from eps_screen.models.loading import load_base

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


@pytest.mark.slow
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
    if full.steps >= 5:  # StepRecorder.steady: the pace after step 2, from 3 steps on
        assert full.steady_tokens_per_s > 0
    else:
        assert full.steady_tokens_per_s is None
    assert full.tokens_per_s > 0

    # Another seed trains another adapter: the agreement above is not two runs that ignore what they are given.
    _train(base, tmp_path, "other", case, False, seed=case[2] + 1, monkeypatch=monkeypatch)
    assert _distance(_adapter(tmp_path / "other"), _adapter(tmp_path / "chunked")) > 100 * ADAPTER_TOL


def test_the_cpu_uses_full_logits_and_a_gpu_the_chunked_head():
    config = _config()
    assert training.speed_options(config, on_gpu=False)["chunked_lm_head"] is False
    assert training.speed_options(config, on_gpu=True)["chunked_lm_head"] is True


def _logged(monkeypatch) -> list[dict]:
    """What the Trainer logs from now on (TRL's SFTTrainer.log ends in Trainer.log)."""
    import transformers

    logs: list[dict] = []
    own = transformers.Trainer.log

    def log(self, entries, start_time=None):
        logs.append(dict(entries))
        return own(self, entries, start_time)

    monkeypatch.setattr(transformers.Trainer, "log", log)
    return logs


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_losses_read_back_in_groups_are_what_the_trainer_logs_each_step(base, tmp_path, monkeypatch, name):
    """train_lora keeps each step's loss on the device and reads a group of steps back at once; with the Trainer's
    own per-step log turned on, every step's loss and learning rate are the ones it logs, and on_step sees every
    step in order."""
    from eps_screen.train import steps as training_steps

    monkeypatch.setattr(training_steps, "TRAINER_ARGS", {"logging_strategy": "steps", "logging_steps": 1})
    monkeypatch.setattr(training_steps, "READBACK_STEPS", 3)
    logs = _logged(monkeypatch)
    seen: list[tuple[int, dict]] = []
    config, whole, seed = CASES[name]
    report = training.train_lora(base, EXAMPLES, config, whole, seed, tmp_path / "run",
                                 on_step=lambda step, values: seen.append((step, values)))
    per_step = [entry for entry in logs if "loss" in entry]
    assert report.steps == len(per_step) == len(report.losses) > training_steps.READBACK_STEPS
    assert [step for step, _ in seen] == list(range(1, report.steps + 1))
    for step, (entry, loss, (_, values)) in enumerate(zip(per_step, report.losses, seen, strict=True), 1):
        assert loss == pytest.approx(entry["loss"], rel=1e-6), f"step {step}"
        assert values["loss"] == loss
        assert values["learning_rate"] == pytest.approx(entry["learning_rate"], rel=1e-9), f"step {step}"
    assert len({round(v["learning_rate"], 12) for _, v in seen}) > 1  # the schedule moves: the check can fail
    assert report.steady_step_s > 0  # more than READBACK_STEPS steps: enough to tell the steady pace


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_the_gpu_trainer_without_trls_metrics_trains_as_trls_own(base, tmp_path, monkeypatch, name):
    """On a GPU train_lora uses TRL's fused LM head without its per-micro-batch metrics (entropy, top-1 accuracy,
    each read back at once); TRL's SFTTrainer as it comes gives the same loss at every step and the same adapter."""
    from trl import SFTTrainer

    from eps_screen.train import steps as training_steps

    case = CASES[name]
    lean = _train(base, tmp_path, "lean", case, True, monkeypatch=monkeypatch)
    logs = _logged(monkeypatch)
    monkeypatch.setattr(training, "_fused_head_trainer",
                        lambda: type("TRLs", (training_steps.StepLossMixin, SFTTrainer), {}))
    monkeypatch.setattr(training_steps, "TRAINER_ARGS", {"logging_strategy": "steps", "logging_steps": 1})
    stock = _train(base, tmp_path, "stock", case, True, monkeypatch=monkeypatch)
    assert any("entropy" in entry for entry in logs)  # TRL's own metrics ran in the stock run
    assert len(lean.losses) == len(stock.losses) == lean.steps > 1
    for step, (a, b) in enumerate(zip(lean.losses, stock.losses, strict=True), 1):
        assert a == pytest.approx(b, rel=LOSS_RTOL), f"step {step}: {a} vs {b}"
    assert _distance(_adapter(tmp_path / "lean"), _adapter(tmp_path / "stock")) < ADAPTER_TOL
