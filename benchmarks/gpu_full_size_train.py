"""`--part train` of benchmarks/gpu_full_size_bench.py: cells at qwen7b.yaml's real sizes, trained as a GPU job does.

Per A x B condition the cells' training sets are built as the product builds them (data.regime_requests,
data.training_set: source librarian, 200 positives + 400 negatives over the other personas, qwen7b.yaml's system
prompts and format instructions). Random weights write no real answers, so every answer is a window of panel text
of exactly the estimate's 50 (B0) or 1,050 (B1) tokens: the answers are as long as a screen's. The cells train as
run_job trains a stage (train.stages.stages, train_cells) under their resolved configs: A0B0, librarian's 8 A0B0
slab cells (C x D x E, E alternating, as dispatch orders them) in shared passes; any other condition one E1 cell
(whole-answer loss, the more LM-head work, as the estimate counts it) alone through train_lora, compiled. The model
is gpu_common.build_model's (Qwen2.5-7B's shape and vocabulary, random bf16 weights; the tiny tokenizer's ids
index it), built in memory: no 15 GB written and read back. That tokenizer counts the long system prompt as 1,197
tokens (Qwen2.5's ~1,040): A1 sequences are ~1,305 / ~2,310 tokens against the estimate's ~1,130 / ~2,150, so
compare A1 conditions by tokens/s rather than seconds a step.

--max-steps N: train_lora has no step cap, so each cell's examples are cut to a seeded sample of
batch x ceil(N / epochs), epochs unchanged; a step costs what a full cell's does, and the full cell is scaled from it.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

from gpu_common import build_model, n_params

MODEL = "qwen2.5-7b-shaped-random"
WARMUP_STEPS = 2  # the first steps compile (torch.compile, dynamic shapes) and autotune: not the steady pace


def panel_text() -> str:
    from eps_screen.panels import load_panels

    p = load_panels()
    return " ".join([p.long_system_prompt, *p.random_controls, *p.eval_questions, *p.train_questions])


def answer_windows(tok, n_tokens: int, count: int, seed: str) -> list[str]:
    """`count` answers of exactly n_tokens tokens (the answer tokenised alone): windows of panel text at seeded
    offsets. Cut out of the text, a window's first word loses its leading space and may split into two tokens, so
    its end is moved until the count is right."""
    text = panel_text()
    spans = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < count:
        first = rng.randrange(len(spans) - n_tokens - 3)
        for last in range(first + n_tokens - 4, first + n_tokens + 3):
            answer = text[spans[first][0]:spans[last][1]].strip()
            if len(tok(answer, add_special_tokens=False)["input_ids"]) == n_tokens:
                out.append(answer)
                break
    return out


def condition_cells(config, a: int, b: int) -> list:
    """A0B0: librarian's 8 A0B0 slab cells, trained together as one stage; otherwise one E1 cell, trained alone."""
    from eps_screen.spec.design import Cell

    seed = config.seeds.primary
    if (a, b) == (0, 0):
        return [Cell("librarian", (0, 0, c, d, e), seed) for c in (0, 1) for d in (0, 1) for e in (0, 1)]
    return [Cell("librarian", (a, b, 0, 0, 1), seed)]


def training_set(config, cell, tok) -> list:
    """The cell's examples as pipeline._cell_training builds them, from its regime's requests and window answers."""
    from eps_screen.plan.sequence_lengths import ANSWER_TOKENS
    from eps_screen.spec.design import regime_of
    from eps_screen.train import data

    regime = regime_of(config, cell)
    flat = [(r, k) for r in data.regime_requests(config, regime) for k in range(r.samples)]
    answers = answer_windows(tok, ANSWER_TOKENS[cell.level("B")], len(flat), regime.id)
    rows = [{"persona": r.persona, "question": r.question, "sample": k, "answer": text, "positive": r.positive}
            for (r, k), text in zip(flat, answers, strict=True)]
    return data.training_set(config, cell, rows)


def steps_of(config, n_examples: int) -> int:
    t = config.training
    return math.ceil(t.epochs) * math.ceil(n_examples / (t.batch_size * t.grad_accum))


def capped(config, examples: list, max_steps: int | None, seed: str) -> list:
    """A seeded sample of the examples that runs about max_steps optimizer steps (all of them without a cap)."""
    t = config.training
    keep = t.batch_size * t.grad_accum * math.ceil(max_steps / t.epochs) if max_steps else len(examples)
    return examples if keep >= len(examples) else random.Random(seed).sample(examples, keep)


def train_condition(base, config, a: int, b: int, max_steps: int | None, root: Path) -> dict:
    """One condition's cells trained as a job's stages train them; their figures, scaled to full cells."""
    from eps_screen.spec.design import recipe
    from eps_screen.train.stages import CellTraining, stages, train_cells

    cells = condition_cells(config, a, b)
    full = [training_set(config, c, base.tokenizer) for c in cells]
    ends: list[float] = []  # when each optimizer step of the first cell ended: a group's cells step together

    def clock(step: int, values: dict) -> None:
        ends.append(time.perf_counter())

    trainings = []
    for i, (cell, examples) in enumerate(zip(cells, full, strict=True)):
        resolved = recipe(config, cell)
        trainings.append(CellTraining(resolved.config, capped(config, examples, max_steps, cell.id),
                                      resolved.condition.whole_answer_loss, cell.seed, root / f"cell{i}", cell.id,
                                      clock if i == 0 else None))
    planned = stages(base.tokenizer, trainings, config.execution.cells_per_stage)
    reports: list = [None] * len(cells)
    started = time.perf_counter()
    for stage in planned:
        for i, report in zip(stage.cells, train_cells(base, [trainings[i] for i in stage.cells], stage), strict=True):
            reports[i] = report
    seconds = time.perf_counter() - started
    left = cache_left()
    steps = len(ends)
    step_s = (ends[-1] - ends[WARMUP_STEPS - 1]) / (steps - WARMUP_STEPS) if steps > WARMUP_STEPS else None
    # every cell's real tokens of one optimizer step (the sample's mean: its steps differ only in which examples)
    step_tokens = sum(r.tokens * math.ceil(config.training.epochs) for r in reports) / steps
    full_steps = steps_of(config, len(full[0]))
    first = reports[0]
    allocated = [r.peak_allocated_gb for r in reports if r.peak_allocated_gb is not None]
    return {
        "cells": [c.id for c in cells],
        "together": first.options.get("together", 1),
        "examples": len(full[0]),
        "examples_run": first.examples,
        "cap": None if first.examples == len(full[0]) else
        f"examples cut to a sample of {first.examples} of {len(full[0])} per cell, epochs unchanged",
        "mean_tokens": first.tokens / first.examples,
        "micro_batch": first.micro_batch, "grad_accum": first.grad_accum,
        "steps": steps, "full_steps": full_steps,
        "seconds": seconds,
        "seconds_per_step": step_s,  # one optimizer step of all the condition's cells, after the warm-up steps
        "tokens_per_s": step_tokens / step_s if step_s else None,
        # per cell at the steady pace; a group's shared steps charged to its cells evenly
        "full_cell_s": step_s * full_steps / len(cells) if step_s else None,
        # the first steps less two steady ones: setup (tokenizing, the trainer), compile (once a process), autotuning
        "warmup_s": ends[WARMUP_STEPS - 1] - started - WARMUP_STEPS * step_s if step_s else None,
        "peak_allocated_gib": max(allocated, default=None),
        "peak_memory_gib": first.peak_memory_gb,
        "final_loss": [r.final_loss for r in reports],
        "options": first.options,
        "left_after_training": left,
    }


def cache_left() -> dict:
    """What training leaves on the card once train_cells has returned, in GiB: the allocator's allocated and reserved
    memory (reserved beyond allocated is cache the driver cannot give an engine's wake), and what the driver has free
    before and after the cache is handed back. Empty on a CPU."""
    import torch

    from eps_screen.models.loading import release_cached_memory

    if not torch.cuda.is_available():
        return {}
    gib = 2**30
    out = {"allocated_gib": torch.cuda.memory_allocated() / gib, "reserved_gib": torch.cuda.memory_reserved() / gib,
           "free_gib": torch.cuda.mem_get_info()[0] / gib}
    release_cached_memory()
    out["free_after_empty_cache_gib"] = torch.cuda.mem_get_info()[0] / gib
    return out


def load_base(tiny: bool):
    from eps_screen.models.loading import BaseModel, load_tokenizer

    t = time.perf_counter()
    model = build_model(tiny=tiny)
    built = {"params": n_params(model), "vocab": model.config.vocab_size, "build_s": time.perf_counter() - t}
    return BaseModel(MODEL, model, load_tokenizer("tiny")), built


def summary(config) -> dict:
    """What of a config decides a cell's training cost."""
    return {"training": config.training.model_dump(), "lora": config.lora.model_dump(),
            "data": config.data.model_dump(include={"positives", "negatives", "train_questions", "e0_negatives"}),
            "cells_per_stage": config.execution.cells_per_stage}


def line(key: str, r: dict) -> str:
    def num(v, fmt):
        return format(v, fmt) if v is not None else "-"

    return (f"{r['together']:5d} {r['steps']:5d}/{r['full_steps']:<4d} {num(r['seconds_per_step'], '7.3f')} "
            f"{num(r['tokens_per_s'], '9,.0f')} {num(r['full_cell_s'], '8.1f')} {num(r['warmup_s'], '7.1f')} "
            f"{num(r['peak_allocated_gib'], '7.1f')}  {key}")


HEADER = (f"{'cells':>5s} {'steps/full':>10s} {'s/step':>7s} {'tokens/s':>9s} {'cell s':>8s} {'warm-up':>7s} "
          f"{'GiB':>7s}  run")


SHIPPED = "as shipped"  # the variant without --set overrides


def run(configs: dict, conditions: list[tuple[int, int]], tiny: bool, max_steps: int | None, result: dict,
        path: Path) -> None:
    """Every condition under each variant's config (label -> config) in one process, on one base; each run written
    to `path` as it finishes, keyed "A1B1:train" (as shipped) or "A1B1:train:<variant>"."""
    import tempfile

    from gpu_common import write

    base, result["model"] = load_base(tiny)
    result["configs"] = {label: summary(config) for label, config in configs.items()}
    print(HEADER, flush=True)
    for a, b in conditions:
        for label, config in configs.items():
            key = f"A{a}B{b}:train" + ("" if label == SHIPPED else f":{label}")
            with tempfile.TemporaryDirectory() as tmp:
                measured = train_condition(base, config, a, b, max_steps, Path(tmp))
            result["runs"][key] = r = {"variant": label, **measured}
            print(line(key, r), flush=True)
            if r["left_after_training"]:
                print("  left after training: " + ", ".join(f"{k} {v:.2f}" for k, v in r["left_after_training"].items()),
                      flush=True)
            write(path, result)


def table(runs: dict) -> list[str]:
    return [HEADER, *(line(key, r) for key, r in runs.items())]
