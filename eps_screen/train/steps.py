"""Each optimizer step's loss, learning rate and pace from a TRL run, read back from the GPU a group of steps at a time.

A Trainer that logs every step reads the loss back every step (`.item()`), which makes the CPU wait for the GPU to
finish the step before it collates and sends the next batch, so the GPU idles for that long every step (on the H200
steps ran 7-10% faster without it and TRL's per-micro-batch metrics: BENCHMARKS.md). Here a step's loss stays on the
device, summed over its micro-batches as the Trainer sums them into the loss it logs, and the steps are read back in
one copy every READBACK_STEPS steps and at the end; a step's end time, learning rate and tokens are taken on the host
as it ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable

READBACK_STEPS = 16
# Merged over no_sync_args: tests and benchmarks/gpu_train_steps_bench.py put the Trainer's own syncs back through it.
TRAINER_ARGS: dict = {}

# Where each optimizer step's loss, learning rate and tokens/s go while a cell trains (eps_screen.run.tracking's
# CellRun.step): (step, {"loss": ..., "learning_rate": ..., "tokens_per_s": ...}).
StepLog = Callable[[int, dict[str, float]], None]


def no_sync_args(on_gpu: bool) -> dict:
    """SFTConfig arguments that keep the Trainer from waiting for the GPU every step: no log of its own (it reads the
    loss back), no NaN filter (an isnan() of each micro-batch's loss), and the next batch copied from pinned memory
    while the step computes (a copy from pageable memory waits for the GPU)."""
    return {"logging_strategy": "no", "logging_nan_inf_filter": False, "dataloader_pin_memory": on_gpu,
            "accelerator_config": {"non_blocking": on_gpu}, **TRAINER_ARGS}


def batch_tokens(inputs: dict) -> int:
    """A micro-batch's tokens as TRL counts them (its num_tokens): a padding-free batch's from its shape, no sync."""
    mask = inputs.get("attention_mask")
    return int(mask.sum()) if mask is not None else int(inputs["position_ids"].size(1))


class StepLossMixin:
    """For a Trainer subclass: keeps the current optimizer step's loss on the device (the sum of its micro-batches'
    training_step results, what the Trainer adds to the loss it logs) and counts the tokens trained on the host."""

    _step_loss = None
    tokens_seen = 0

    def training_step(self, model, inputs, num_items_in_batch=None):
        tokens = batch_tokens(inputs)
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._step_loss = loss if self._step_loss is None else self._step_loss + loss
        self.tokens_seen += tokens
        return loss

    def take_step_loss(self):
        loss, self._step_loss = self._step_loss, None
        return loss


class StepRecorder:
    """Per-step figures of one train_lora run: `losses` and `marks` ((end time, tokens so far) per step) once the run
    ends, each step handed to `on_step` when its group is read back."""

    def __init__(self, on_step: StepLog | None = None):
        from transformers import TrainerCallback

        self.losses: list[float] = []
        self.marks: list[tuple[float, float]] = []
        self.trainer = None  # set once the trainer exists: its callback reads the step losses from it
        pending: list[tuple] = []
        began = [time.perf_counter()]
        rate = [0.0]
        recorder = self

        def read_back() -> None:
            import torch

            if not pending:
                return
            values = torch.stack([p[1].float() for p in pending]).tolist()
            for (step, _, lr, now, tokens), loss in zip(pending, values, strict=True):
                t0, n0 = recorder.marks[-1] if recorder.marks else (began[0], 0.0)
                recorder.marks.append((now, float(tokens)))
                recorder.losses.append(loss)
                if on_step is not None:
                    figures = {"loss": loss, "learning_rate": lr}
                    if now > t0:
                        figures["tokens_per_s"] = (tokens - n0) / (now - t0)
                    on_step(step, figures)
            pending.clear()

        class Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                began[0] = time.perf_counter()

            def on_optimizer_step(self, args, state, control, lr_scheduler=None, **kwargs):
                # before the scheduler steps: the rate this step used, as the Trainer logs it
                if lr_scheduler is not None:
                    rate[0] = float(lr_scheduler.get_last_lr()[0])

            def on_step_end(self, args, state, control, **kwargs):
                loss = recorder.trainer.take_step_loss()
                if loss is not None:
                    pending.append((state.global_step, loss, rate[0], time.perf_counter(), recorder.trainer.tokens_seen))
                if len(pending) >= READBACK_STEPS:
                    read_back()

            def on_train_end(self, args, state, control, **kwargs):
                read_back()

        self.callback = Callback()

    def steady(self, skip: int = 2) -> float | None:
        """Tokens/s between the end of step `skip` and the last step (None with too few steps to tell)."""
        if len(self.marks) < skip + 3:
            return None
        (t0, n0), (t1, n1) = self.marks[skip - 1], self.marks[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None

    def steady_step_s(self, skip: int = 2) -> float | None:
        """Seconds per optimizer step after step `skip` (None with too few steps)."""
        if len(self.marks) < skip + 3:
            return None
        return (self.marks[-1][0] - self.marks[skip - 1][0]) / (len(self.marks) - skip)
