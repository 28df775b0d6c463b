"""Will a GPU job fit the card? Memory of the training and evaluation stages, checked before anything is rented.

One process trains and evaluates on one GPU (eps_screen.run.engines): the training base stays resident; the vLLM
engine sleeps through training (it keeps ~1 GB) and, awake, holds its own copy of the weights, CUDA graphs,
activations and a KV cache sized to what is left. Figures measured on the H200 (7B shape, bf16, LoRA r=32):
- training peak = base weights + ~4.4 MB per token of the largest micro-batch (89 GB at 8 x 2,121 tokens,
  54 GB with <= 11,000-token micro-batches: benchmarks/results/gpu_train_h200_compile*.json);
- the sleeping engine: 14.3 GiB in use beside a 13.5 GiB base, so ~0.8 GiB of its own
  (benchmarks/results/gpu_job_h200.json's log); CUDA graphs 1.2 GiB and activations 2.2 GiB when awake.
- cells trained together (a job's A0B0 cells in shared passes): ~5.9 MB per token of a pass, eager, and ~1.2 GiB of
  LoRA weights, gradients and AdamW state per cell at r=32 (benchmarks/results/gpu_together_h200_run2.json, _run3).
Both scale with the parameter count from the 7.6B measurements. They count allocated memory: the driver shows up to
~50% more during training, the allocator's cache (BENCHMARKS.md, "GPU memory as the device holds it"), and an 80 GB
run showed that beside the sleeping engine it is not handed back in time, so a card is judged on that device figure.
"""

from __future__ import annotations

from dataclasses import dataclass

from eps_screen.generation.vllm_backend import engine_margin_gib
from eps_screen.models.shape import model_params, model_vocab
from eps_screen.plan.sequence_lengths import sequence_tokens
from eps_screen.spec.config import ScreenConfig
from eps_screen.train.stages import most_together, trains_together

# GiB of memory of the RunPod GPU types a config may allow (the vendors' figures, as the card reports them).
GPU_MEMORY_GIB = {
    "NVIDIA H200": 139.8,
    "NVIDIA H100 80GB HBM3": 79.6,
    "NVIDIA H100 PCIe": 79.6,
    "NVIDIA H100 NVL": 93.1,
    "NVIDIA A100 80GB PCIe": 79.2,
    "NVIDIA A100-SXM4-80GB": 79.2,
    "NVIDIA L40S": 44.4,
    "NVIDIA RTX 6000 Ada Generation": 47.5,
    "NVIDIA RTX A6000": 47.5,
    "NVIDIA GeForce RTX 4090": 23.6,
}
REFERENCE_PARAMS = 7.6e9
TRAIN_GIB_PER_TOKEN = 4.4e-3  # at the 7.6B shape, LoRA r=32 on all linear layers, padding-free, compiled
SLEEPING_ENGINE_GIB = 0.8
AWAKE_OVERHEAD_GIB = 3.4  # CUDA graphs + the engine's activation peak
# Cells trained together (eps_screen.train.together, eager): activations per token of a shared pass, and each
# cell's LoRA weights, gradients and AdamW state (16 bytes per fp32 parameter; 80.7M parameters at r=32 on the 7B
# shape). 8 A0B0 cells, 6,374 tokens a pass: 61.6 and 62.0 GiB allocated (benchmarks/results/gpu_together_h200_run2.json,
# _run3.json).
TOGETHER_GIB_PER_TOKEN = 5.9e-3
ADAPTER_STATE_GIB_R32 = 1.2
# What the device holds during training per GiB allocated: the allocator's cache on top, which does not come back
# in time beside the sleeping engine. Measured on the H200: 59.8 / 40.2 GiB (A1 cells, the GPU job test), 82-84 /
# 54-56 GiB (full-size A1B1); and the A1 job the plan put at 57.6 GiB allocated ran out of memory at 79 GiB on an
# H200 made an 80 GB card by a ballast process (BENCHMARKS.md, "An 80 GB card"). A card is judged on this figure.
DEVICE_PER_ALLOCATED = 1.5
MIN_KV_GIB = 8.0  # below this vLLM decodes too few sequences at once to be worth its start
MARGIN_GIB = 3.0  # left free beside training

BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class MemoryPlan:
    weights_gib: float
    train_peak_gib: float  # training, engine asleep
    eval_min_gib: float  # base resident + awake engine with the smallest useful KV cache
    offpolicy_min_gib: float | None  # the off-policy model's engine, the base's in host memory (engines.generator)

    @property
    def train_device_gib(self) -> float:
        """Training's peak as the device holds it (allocated, and the allocator's cache)."""
        return self.train_peak_gib * DEVICE_PER_ALLOCATED

    def problems(self, gpu: str) -> list[str]:
        have = GPU_MEMORY_GIB[gpu]
        out = []
        for stage, need in (("training", self.train_device_gib), ("evaluation", self.eval_min_gib),
                            ("off-policy answers", self.offpolicy_min_gib)):
            if need is not None and need > have:
                out.append(f"{stage} needs ~{need:.0f} GiB, {gpu} has {have:.0f}")
        return out


def memory_plan(config: ScreenConfig) -> MemoryPlan | None:
    """Memory of a GPU job of this config; None when the model's size is unknown (a hub id without a size)."""
    params = model_params(config.model.base)
    if params is None:
        return None
    scale = params / REFERENCE_PARAMS
    weights = params * BYTES[config.model.dtype] / 2**30
    t = config.training
    longest = 1.2 * sequence_tokens(config, 1, 1)[2]  # answers vary +-20% around the condition's length
    batch_tokens = t.batch_size * longest
    if t.max_batch_tokens:
        batch_tokens = min(batch_tokens, max(t.max_batch_tokens, longest))
    train = weights + TRAIN_GIB_PER_TOKEN * scale * batch_tokens + SLEEPING_ENGINE_GIB + MARGIN_GIB
    cells = most_together(config)
    if trains_together(config):  # a stage's short (A0B0) cells share passes, up to the token budget
        short = 1.2 * sequence_tokens(config, 0, 0)[2]
        pass_tokens = cells * t.batch_size * short
        if t.max_batch_tokens:
            pass_tokens = min(pass_tokens, max(t.max_batch_tokens, t.batch_size * short))
        together = (weights + TOGETHER_GIB_PER_TOKEN * scale * pass_tokens
                    + cells * ADAPTER_STATE_GIB_R32 * config.lora.rank / 32 * scale + SLEEPING_ENGINE_GIB + MARGIN_GIB)
        train = max(train, together)
    awake = AWAKE_OVERHEAD_GIB * scale + MIN_KV_GIB + engine_margin_gib(model_vocab(config.model.base))
    off = None
    if config.off_policy.kind == "model" and config.off_policy.model and config.off_policy.model != "tiny-alt":
        off_params = model_params(config.off_policy.model)
        if off_params is not None:
            off_scale = off_params / REFERENCE_PARAMS
            off_bytes = 1 if config.off_policy.vllm_quantization == "fp8" else BYTES[config.model.dtype]
            off = (SLEEPING_ENGINE_GIB + off_params * off_bytes / 2**30 + AWAKE_OVERHEAD_GIB * off_scale + MIN_KV_GIB
                   + engine_margin_gib(model_vocab(config.off_policy.model)))
    return MemoryPlan(weights, train, 2 * weights + awake, off)


def memory_problems(config: ScreenConfig) -> list[str]:
    """One line per allowed GPU type (execution.gpu_types) that a job of this config would not fit, naming the
    fix; empty for in-process screens and when everything fits."""
    if config.execution.pool == "inprocess" or config.model.base.startswith("tiny"):
        return []
    plan = memory_plan(config)
    unknown = [g for g in config.execution.gpu_types if g not in GPU_MEMORY_GIB]
    out = [f"execution.gpu_types: {g!r} has no known memory size; known: {', '.join(GPU_MEMORY_GIB)}" for g in unknown]
    if plan is None:
        return out
    for gpu in config.execution.gpu_types:
        if gpu in unknown:
            continue
        for problem in plan.problems(gpu):
            if problem.startswith("training"):
                tokens = batch_tokens_that_fit(config, GPU_MEMORY_GIB[gpu])
                fix = (f"set training.max_batch_tokens to at most {tokens}" if tokens else
                       "a card with more memory (no micro-batch of a whole sequence fits)")
            elif problem.startswith("off-policy"):
                fix = f"{_off_policy_in_8_bits(config, gpu)}off_policy.kind: jsonl (answers from a file)"
            else:
                fix = "a smaller model"
            out.append(f"execution.gpu_types: {problem}: remove {gpu!r}, or {fix}")
    return out


def _off_policy_in_8_bits(config: ScreenConfig, gpu: str) -> str:
    """The fix of 8-bit weights for the off-policy engine, where that would fit `gpu`; else nothing."""
    if config.off_policy.vllm_quantization != "none":
        return ""
    fp8 = config.with_sets({"off_policy.vllm_quantization": "fp8"})
    fits = not any(p.startswith("off-policy") for p in memory_plan(fp8).problems(gpu))
    return "off_policy.vllm_quantization: fp8 (its weights in 8 bits fit), or " if fits else ""


def batch_tokens_that_fit(config: ScreenConfig, have_gib: float) -> int | None:
    """The largest training.max_batch_tokens whose training peak, as the device holds it, fits `have_gib` (it caps
    a long cell's micro-batch and, for cells trained together, their shared pass); None when not even a micro-batch
    of one whole sequence, or a pass of one batch of short cells beside their adapters, fits."""
    params = model_params(config.model.base)
    if params is None:
        return None
    scale = params / REFERENCE_PARAMS
    weights = params * BYTES[config.model.dtype] / 2**30
    room = have_gib / DEVICE_PER_ALLOCATED - weights - SLEEPING_ENGINE_GIB - MARGIN_GIB
    tokens = room / (TRAIN_GIB_PER_TOKEN * scale)
    floor = 1.2 * sequence_tokens(config, 1, 1)[2]
    if trains_together(config):
        cells = most_together(config)
        state = cells * ADAPTER_STATE_GIB_R32 * config.lora.rank / 32 * scale
        tokens = min(tokens, (room - state) / (TOGETHER_GIB_PER_TOKEN * scale))
        floor = max(floor, config.training.batch_size * 1.2 * sequence_tokens(config, 0, 0)[2])
    return int(tokens // 100 * 100) if tokens >= floor else None


def memory_lines(config: ScreenConfig) -> list[str]:
    plan = memory_plan(config)
    if plan is None or config.execution.pool == "inprocess":
        return []
    off = f", off-policy answers ~{plan.offpolicy_min_gib:.0f}" if plan.offpolicy_min_gib else ""
    fits = [g for g in config.execution.gpu_types if g in GPU_MEMORY_GIB and not plan.problems(g)]
    lines = [(f"GPU memory: training ~{plan.train_peak_gib:.0f} GiB allocated (~{plan.train_device_gib:.0f} on the "
              f"device), evaluation >= {plan.eval_min_gib:.0f} GiB{off};"
              f" fits {', '.join(fits) or 'none of execution.gpu_types'}")]
    if config.training.processes > 1:
        # Not modelled: the plan counts one trainer with the engines asleep.
        lines.append(f"  training.processes: {config.training.processes} trainers beside the awake engines are not in"
                     " this plan; SmolLM2-135M's four beside four engines filled up to 135 GiB of an H200 in its long"
                     " cells' stages at training.max_batch_tokens 28000"
                     " (BENCHMARKS.md): on a smaller card, fewer trainers or a smaller training.max_batch_tokens")
    return lines
