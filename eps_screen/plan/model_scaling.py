"""The measured figures, all of a Qwen2.5-7B-shaped model, carried over to the model a config screens.

A model of another shape computes a different number of FLOPs per token: its training and generation figures are
the 7B's times the ratio of FLOPs per token (model_shape.flops_per_token, at the condition's sequence length). A
small model is not bound by its FLOPs, though: a training step and a decode step cost time of their own (kernel
launches, the optimizer, scheduling). That floor was measured by hand on SmolLM2-135M-Instruct (figures.json
"anchor/smollm2-h100/*", an H100): a model smaller than the 7B is counted at the FLOPs ratio, but at most at those
anchors' speed, and never slower than the 7B itself. Its engine starts as the nearer (by parameters) of the two
measured models' did. Where only a parameter count is known (a hub id with a size in its name) the figures scale by
parameters instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from eps_screen.models.shape import MEASURED, model_params, model_shape
from eps_screen.plan.figures import Figure, entry, figure
from eps_screen.plan.memory import REFERENCE_PARAMS
from eps_screen.plan.sequence_lengths import sequence_tokens
from eps_screen.spec.config import ScreenConfig



@dataclass
class ScaledRates:
    train: dict[str, Figure]
    generate: dict[str, Figure]
    answers: dict[str, Figure] | None
    engine: str = "start/vllm"  # the figures of the engine's start: the nearer measured model's
    compile_warmup: str = "start/compile-warmup"  # what training.compile costs a job: the nearer measured model's
    sleep_factor: float = 1.0  # an engine's first sleep moves its weights: by their size
    notes: list[str] = field(default_factory=list)


def _scaled(f: Figure, factor: float, ceiling: Figure | float | None, how: str) -> Figure:
    value = f.value * factor
    source, note = f.source, f"x{factor:.2f} {how}"
    if ceiling is not None and factor > 1:
        cap = ceiling.value if isinstance(ceiling, Figure) else ceiling
        if value > cap:
            value = max(f.value, cap)
            note = (f"x{factor:.2f} {how}, capped at the small model's measured speed"
                    if cap > f.value else "the 7B's figure: the small model's measured speed is no faster")
            if isinstance(ceiling, Figure):
                source = f"{f.source}, {ceiling.source}"
    return Figure(round(value), f.unit, source, note)


def train_step_s(key: str = "anchor/smollm2-h100/train") -> float:
    """Seconds of a LoRA training step of the small anchor model (its measured run over its steps)."""
    e = entry(key)
    return e["value"] / (e["examples"] * e["epochs"] / e["batch_size"])


# Trainer processes (training.processes) were measured at 4 beside four engines: fewer count as one.
TRAINERS_MEASURED = 4


def compile_factor() -> float:
    """A stage of long cells in four workers with training.compile, over the same stage without (an H100)."""
    return figure("anchor/smollm2-h100/stage-a1-compiled").value / figure("anchor/smollm2-h100/stage-a1-eager").value


def cell_step_s(config: ScreenConfig, condition: str) -> float:
    """Seconds of job wall a training step of one cell of the small anchor model costs: alone in the job's process;
    or, with training.processes >= 4, a short (A0) cell's in a stage that shares passes and a long (A1) cell's in
    one of four workers training at once (each the stage's wall over its cells), the latter at compile_factor()
    with training.compile. Shared passes never compile, and a cell alone in the job's process was not measured
    compiled: both count as eager."""
    from eps_screen.train.stages import trains_together

    if config.training.processes < TRAINERS_MEASURED:
        return train_step_s()
    shared = condition.startswith("A0") and trains_together(config)
    step = train_step_s("anchor/smollm2-h200/train-" + ("shared" if shared else "workers"))
    return step * compile_factor() if config.training.compile and not shared else step


# Several engines of the base model on one card (eval.vllm_engines) were measured at 4 only: fewer count as one.
GROUP_MEASURED = 4


def _generation_anchors(config: ScreenConfig) -> tuple[Figure, Figure]:
    """The small model's generation ceilings (through an adapter, without): one engine's, or at
    eval.vllm_engines >= 4 the four engines' (more are not counted faster)."""
    suffix = "-4engines" if vllm_engines_counted(config) == GROUP_MEASURED else ""
    return figure(f"anchor/smollm2-h100/vllm-lora{suffix}"), figure(f"anchor/smollm2-h100/vllm-base{suffix}")


def vllm_engines_counted(config: ScreenConfig) -> int:
    return GROUP_MEASURED if config.eval.vllm_engines >= GROUP_MEASURED else 1


def _engines_said(config: ScreenConfig) -> str:
    n = config.eval.vllm_engines
    if n == 1:
        return "one engine"
    if n == GROUP_MEASURED:
        return f"{n} engines (eval.vllm_engines)"
    return (f"counted as {vllm_engines_counted(config)} engine(s): eval.vllm_engines={n} is not measured, only 1"
            f" and {GROUP_MEASURED}")


def scale_to_model(config: ScreenConfig, train: dict[str, Figure], generate: dict[str, Figure],
                   answers: dict[str, Figure] | None, vllm: bool = True) -> ScaledRates:
    """The rates for config.model.base's shape (unchanged for the 7B shape, or a model of unknown size); `vllm`:
    the generation figures are vLLM's (else transformers', which a smaller model does not speed up)."""
    ref = config.model.base
    shape = model_shape(ref)
    if shape == MEASURED or shape is None and not model_params(ref):
        return ScaledRates(train, generate, answers)
    if shape is None:  # a size from the name only
        params = model_params(ref)
        if abs(params / REFERENCE_PARAMS - 1) <= 0.25:
            return ScaledRates(train, generate, answers)
        s = REFERENCE_PARAMS / params
        scale = {c: s for c in train}
        how = "by parameters"
        note = f"{ref}: figures scaled from the 7.6B-parameter measurements by parameter count"
    else:
        params = shape.params
        scale = {}
        for c in train:
            seq = sequence_tokens(config, int(c[1]), int(c[3]))[2]
            scale[c] = MEASURED.flops_per_token(seq / 2) / shape.flops_per_token(seq / 2)
        how = "by FLOPs per token"
        note = (f"{ref}: {params / 1e6:,.0f}M parameters ({shape.layers} layers, hidden {shape.hidden}, vocabulary"
                f" {shape.vocab:,}): the 7B's figures x{min(scale.values()):.2f}-x{max(scale.values()):.2f} by FLOPs"
                " per token")
    small = params < REFERENCE_PARAMS
    t = {c: _scaled(f, scale[c], config.training.batch_size / cell_step_s(config, c)
                    * sequence_tokens(config, int(c[1]), int(c[3]))[2] if small else None, how)
         for c, f in train.items()}
    lora, base = _generation_anchors(config)
    g = {c: _scaled(f, scale[c], lora if small else None, how) for c, f in generate.items()}
    if small and not vllm:  # transformers' decode is bound by Python per step (BENCHMARKS.md): no gain from a smaller model
        g = dict(generate)
    a = {c: _scaled(f, scale[c], base if small else None, how) for c, f in answers.items()} if answers else None
    out = ScaledRates(t, g, a, notes=[note])
    if small and not vllm:
        out.notes.append("transformers generation at the 7B's figures: its decode is bound by Python per step")
    if small:
        if config.training.processes >= TRAINERS_MEASURED:
            compiled = (f"; A1 x{compile_factor():.2f} for training.compile, from an H100's stages"
                        if config.training.compile else "")
            trained = (f"a cell's training step at most {cell_step_s(config, 'A0B0'):.3f} s of the job's wall (A0) and"
                       f" {cell_step_s(config, 'A1B0'):.3f} s (A1), {config.training.processes} trainer processes"
                       f" (counted as 4; SmolLM2-135M on an H200{compiled})")
        else:
            trained = (f"training at most one step per {train_step_s():.2f} s"
                       + (" (training.processes below 4 counted as one)" if config.training.processes > 1 else ""))
        out.notes.append(f"a model smaller than the 7B: {trained}, and generation at most {lora.value:,.0f} tokens/s"
                         f" through an adapter, {base.value:,.0f} without (SmolLM2-135M on an H100,"
                         f" {_engines_said(config)})")
    anchor_params = model_params("smollm2-135m-instruct")
    if abs(math.log(params / anchor_params)) < abs(math.log(params / REFERENCE_PARAMS)):
        out.engine = "anchor/smollm2-h100/engine"
        out.compile_warmup = "anchor/smollm2-h100/compile-warmup"
    out.sleep_factor = params / REFERENCE_PARAMS
    return out
