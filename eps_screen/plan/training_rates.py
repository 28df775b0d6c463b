"""Training tokens/s per A x B condition on the H200, from the measured figures (eps_screen/plan/figures.json): the
profile the config's training options give, the micro-batches training.max_batch_tokens cuts a batch into, shared
prefixes, the step without per-step syncs, and a job's short cells trained together.

All measured on a Qwen2.5-7B-shaped model, bf16, LoRA r=32 on all linear layers, batch 8, whole-answer labels (E0
runs ~6% faster: counted as E1), steady state after 2 warm-up steps.
"""

from __future__ import annotations

import math

from eps_screen.plan.figures import RESULTS, Figure, entry, figure
from eps_screen.plan.screen_work import CONDITIONS
from eps_screen.plan.sequence_lengths import sequence_tokens
from eps_screen.spec.config import ScreenConfig
from eps_screen.train.lora import speed_options, split_batch
from eps_screen.train.stages import most_together, trains_together

# A job's short (A0B0) cells trained together: measured with this many full-size cells in shared passes. Longer
# conditions fill a pass with one cell's micro-batch and train alone.
TOGETHER_CELLS = 8


def training_profile(config: ScreenConfig) -> tuple[str, list[str]]:
    t = config.training
    notes = []
    if t.gradient_checkpointing:
        profile = "padfree+liger+gc"
        if not t.packing:
            notes.append("gradient checkpointing without packing is not measured: padding-free figures used")
    elif not t.packing:
        profile = "padded+liger"
    elif t.compile:
        profile = "padfree+fused+compile"
    else:
        profile = "padfree+liger+fused"
        notes.append("training.compile would make training ~10% faster (padfree+fused+compile figures)")
    return profile, notes


def train_rates(config: ScreenConfig, profile: str, notes: list[str]) -> dict[str, Figure]:
    """Training tokens/s per A x B condition, each measured with the micro-batches that training.max_batch_tokens
    cuts the condition's batches into (a split batch trains slower); where that split was not measured, the
    whole-batch figure, noted. A job's A0B0 cells at the together figure where they share passes."""
    t = config.training
    rates = {c: figure(f"train/{profile}/{c}") for c in CONDITIONS}
    shares = speed_options(config, on_gpu=True)["share_prefix"]
    for c in CONDITIONS:
        seq = math.ceil(sequence_tokens(config, int(c[1]), int(c[3]))[2])
        micro, accum = split_batch(t.batch_size, 1, seq, t.max_batch_tokens)
        if micro < t.batch_size:
            split = figure(f"train-split/{profile}/{c}/{micro}x{accum}",
                           f"{accum} micro-batches of {micro} a step, as training.max_batch_tokens cuts the batch")
            if split:
                rates[c] = split
            else:
                notes.append(f"train {c}: {accum} micro-batches of {micro} a step (training.max_batch_tokens "
                             f"{t.max_batch_tokens}) not measured under {profile}: its whole-batch figure used (faster)")
        if shares and c[1] == "1":
            rates[c] = _times(rates[c], f"shared-prefix/{c}/{micro}", "with shared prefixes at qwen7b.yaml's persona mix",
                              notes, f"train {c}: shared prefixes not measured with micro-batches of {micro}: counted as none")
        # A0B0 (short, trained together by default) was not measured: its figure stays as before, the slower one
        if profile == "padfree+fused+compile" and c != "A0B0" and (shares or c[1] == "0"):
            rates[c] = _times(rates[c], f"step-syncs/{c}/{micro}", "without the Trainer's per-step syncs", notes,
                              f"train {c}: the step without per-step syncs not measured with micro-batches of {micro}:"
                              " counted as before", keep_note=True)
    together = figure(f"train-together/A0B0/{TOGETHER_CELLS}", f"{TOGETHER_CELLS} cells of a job in shared passes")
    if trains_together(config) and together is not None:
        rates["A0B0"] = Figure(together.value, together.unit, together.source, together.note)
        if most_together(config) < TOGETHER_CELLS:
            notes.append(f"A0B0 cells trained together measured {TOGETHER_CELLS} to a job; at most "
                         f"{most_together(config)} (execution.cells_per_job, cells_per_stage) share fewer passes"
                         " (slower than counted)")
    return rates


def _times(rate: Figure, key: str, what: str, notes: list[str], missing: str, keep_note: bool = False) -> Figure:
    """A condition's figure times a measured speed-up (figures.json `key`); unchanged, noted, where not measured."""
    e = entry(key)
    if e is None:
        notes.append(missing)
        return rate
    note = f"x{e['value']:.2f} {what}"
    return Figure(round(rate.value * e["value"]), rate.unit, f"{rate.source}, {RESULTS}{e['result']}",
                  f"{rate.note}; {note}" if keep_note and rate.note else note)
