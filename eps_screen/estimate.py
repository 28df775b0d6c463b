"""GPU-hours and cost of a screen from measured throughput: what `eps-screen validate` prints before renting.

Work is counted from the config's declared design (its cells of every phase, each under its own recipe: examples,
epochs and sequence lengths per A x B prompt condition, answers and their lengths, generation regimes, the
pre-screen's conditions; GPU jobs as phase_sizes.dispatch_groups sends them) and divided by figures measured on the H200
test machine (BENCHMARKS.md, section GPU; each figure names its result file). Where no measurement exists the
estimate says so in `notes` and uses the nearest measured figure; a figure can be overridden from the config
(`estimate.*` fields, read with defaults until config.py has them).

The tiny preset runs on the CPU: its figures are CPU measurements and its cost is zero.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path

from eps_screen import design, wall_clock
from eps_screen.config import ScreenConfig
from eps_screen.generation.transformers_backend import batch_spans
from eps_screen.job.memory import REFERENCE_PARAMS, model_params
from eps_screen.job.training import by_stage, most_together, stage_split, trains_together
from eps_screen.phase_sizes import dispatch_groups, known_dispatches, multiseed_count
from eps_screen.sequence_lengths import ANSWER_TOKENS, TOKENS_PER_WORD, sequence_tokens
from eps_screen.training import speed_options, split_batch

CONDITIONS = ("A0B0", "A1B0", "A0B1", "A1B1")


@dataclass(frozen=True)
class Figure:
    value: float
    unit: str
    source: str
    note: str = ""


_R = "benchmarks/results/"
# Training tokens/s per A x B condition on one H200, Qwen2.5-7B-shaped model, bf16, LoRA r=32 all linear,
# batch 8, whole-answer labels (E0 runs ~6% faster: counted as E1), steady state after 2 warm-up steps.
H200_TRAIN = {
    "padfree+fused+compile": {
        "A0B0": Figure(4835, "tokens/s", _R + "gpu_train_h200_compile2.json"),
        "A1B0": Figure(16762, "tokens/s", _R + "gpu_train_h200_compile.json"),
        "A0B1": Figure(15583, "tokens/s", _R + "gpu_train_h200_compile.json"),
        "A1B1": Figure(16060, "tokens/s", _R + "gpu_train_h200_compile2.json"),
    },
    "padfree+liger+fused": {
        "A0B0": Figure(2766, "tokens/s", _R + "gpu_train_h200_run2.json"),
        "A1B0": Figure(15768, "tokens/s", _R + "gpu_train_h200_run2.json"),
        "A0B1": Figure(13441, "tokens/s", _R + "gpu_train_h200_run2.json"),
        "A1B1": Figure(15400, "tokens/s", _R + "gpu_train_h200_run2.json"),
    },
    "padfree+liger+gc": {  # measured before the fused LoRA epilogue: a floor
        "A0B0": Figure(1475, "tokens/s", _R + "gpu_train_h200_run1.json"),
        "A1B0": Figure(9646, "tokens/s", _R + "gpu_train_h200_run1.json"),
        "A0B1": Figure(9155, "tokens/s", _R + "gpu_train_h200_run1.json"),
        "A1B1": Figure(9529, "tokens/s", _R + "gpu_train_h200_run1.json"),
    },
    "padded+liger": {  # measured before the fused LoRA epilogue: a floor
        "A0B0": Figure(2953, "tokens/s", _R + "gpu_train_h200_run1.json"),
        "A1B0": Figure(13306, "tokens/s", _R + "gpu_train_h200_run1.json"),
        "A0B1": Figure(11238, "tokens/s", _R + "gpu_train_h200_run1.json"),
        "A1B1": Figure(10689, "tokens/s", _R + "gpu_train_h200_run1.json"),
    },
}
# The same profiles with each batch of 8 cut into micro-batches (training.max_batch_tokens, training.split_batch): the
# result file and the variant whose runs give a condition's figure for the split the config gives it.
SPLIT_RESULTS = {"padfree+fused+compile": ("gpu_train_h200_compile3.json", "padfree+fused+compile+tok11k"),
                 "padfree+liger+fused": ("gpu_train_h200_run2.json", "padfree+liger+fused+tok11k")}
# A GPU job's short (A0B0) cells trained together (eps_screen.job.training): 8 full-size cells in shared passes,
# read from the committed result file. Longer conditions fill a pass with one cell's micro-batch and train alone.
TOGETHER_RESULT = "gpu_together_h200_run3.json"
TOGETHER_CELLS = 8
# Shared prefixes (training.share_prefix): a step's time without over with them, for one A1 cell at qwen7b.yaml's
# sizes and persona mix, both in one process once compiled (the "-again" runs of benchmarks/gpu_prefix_bench.py).
# (condition, micro-batch) -> the runs' suffix: which split each pair was measured with.
PREFIX_RESULT = "gpu_prefix/gpu_prefix_bench_h200_run2.json"
PREFIX_RUNS = {("A1B0", 8): "", ("A1B1", 4): "", ("A1B1", 8): "-17k"}
# The Trainer without its per-step GPU syncs (eps_screen.training_steps): a step's time before over after, for one
# E1 cell per condition at qwen7b.yaml's sizes (compiled, shared prefixes, its micro-batches), both in one process
# (the "-again" runs of benchmarks/gpu_train_steps_bench.py). A0B0 trains together, in its own loop: not measured.
STEPS_RESULT = "gpu_train_steps_h200.json"


@cache
def _result(file: str) -> dict | None:
    """A committed result file (benchmarks/results), read once per process; None where it is not there (an
    installed package without the repository's benchmarks)."""
    path = Path(__file__).resolve().parents[1] / _R / file
    return json.loads(path.read_text()) if path.is_file() else None


def _result_runs(file: str) -> list | dict | None:
    return (_result(file) or {}).get("runs")


def tiny_vocab_files(kinds: tuple[str, ...] = ("eval", "answers", "off-policy")) -> list[str]:
    """FULL_SIZE's files of those kinds measured at the tiny tokenizer's 2,048-word vocabulary (gpu_full_size_bench.py
    records "vocab" since it can keep Qwen2.5's; files from before are the tiny one's)."""
    files = dict.fromkeys(f for kind in kinds for f in FULL_SIZE[kind])
    return [f for f in files if (_result(f) or {}).get("vocab", "tinyvocab") != "fullvocab"]


def measured_run(file: str, **match) -> dict | None:
    """The run of a result file whose fields match, or None."""
    return next((r for r in _result_runs(file) or [] if all(r.get(k) == v for k, v in match.items())), None)


H200_COMPILE_WARMUP_S = Figure(25, "s per process", _R + "gpu_train_h200_compile.json", "first A1B1 run minus steady")
# Generation tokens/s on one H200, transformers `generate` (dynamic cache, sampling, 256 new tokens), 7B-shaped, by
# prompt condition and sequences per generate() call (decode is bound by Python per step, so more rows are nearly
# free until memory runs out). With a PEFT LoRA adapter (r=32) where measured: cells are evaluated with theirs.
_GB = _R + "gpu_generate_h200_batch3.json"  # one process, every call with the adapter (runs 1-2: +-25% around these)
H200_GENERATE = {
    "A0": {256: Figure(2708, "tokens/s", _GB, "45-token prompts, LoRA adapter, 256 rows"),
           1024: Figure(8626, "tokens/s", _GB, "45-token prompts, LoRA adapter, 1024 rows"),
           2048: Figure(11645, "tokens/s", _GB, "45-token prompts, LoRA adapter, 2048 rows")},
    "A1": {256: Figure(1819, "tokens/s", _GB, "1045-token prompts, LoRA adapter, 256 rows")},
}
# Rows per call that ran out of the H200's memory: prefill holds rows x 1045 tokens x the 18,944-wide MLP (37.8 GiB at
# 1024 rows) beside the KV cache; 512 rows failed too, with and without an adapter.
H200_GENERATE_OOM_ROWS = {"A1": 512}
# vLLM on one H200 (vLLM 0.26.0, torch 2.11), 7B-shaped model, LoRA r=32 on all linear layers, CUDA graphs up to
# 1,024-sequence batches (eval.vllm_cudagraph_max_batch). Per prompt condition: one cell's panel, 1,500 sampled
# requests of up to 256 tokens (benchmarks/gpu_lora_eval_bench.py): through the LoRA kernels and without an adapter
# (answer sets, pre-screen) in one process (the lower of two runs: the other gave 21,582 / 15,484 with the adapter);
# merged into the weights (eval.vllm_merge_adapter): both conditions in one later process, each merge (0.3-0.5 s on
# the GPU) and restore included.
_LG = _R + "gpu_lora_knobs/call3/knob_graphs_1024_repeat.json"
_LM = _R + "gpu_lora_eval_h200_graphs.json"
_LMA = _R + "gpu_lora_eval_h200_merged.json"
_J1, _J2, _JT = _R + "gpu_job_h200.json", _R + "gpu_job_h200_run2.json", _R + "gpu_job_test_h200.json"
_JTG = _R + "gpu_job_test_h200_graphs.json"
H200_VLLM = {
    "lora": {0: Figure(18206, "tokens/s", _LG, "A0, the adapter through LoRA kernels"),
             1: Figure(15366, "tokens/s", _LG, "A1, the adapter through LoRA kernels")},
    "merged": {0: Figure(21673, "tokens/s", _LMA, "A0, adapter merged, its merge and restore included"),
               1: Figure(16283, "tokens/s", _LMA, "A1, adapter merged, its merge and restore included")},
    "base": {0: Figure(23076, "tokens/s", _LG, "A0, no adapter"),
             1: Figure(18220, "tokens/s", _LG, "A1, no adapter")},
}
# vLLM at qwen7b.yaml's real sizes (benchmarks/gpu_full_size_bench.py, one H200, 2026-12-03): per A x B condition,
# answers forced to the estimate's 50 / 1,050 tokens, a cell's 2,500-answer panel through a random r=32 adapter
# ("eval"), a regime's 600-answer set without one ("answers"), and the answer sets of a Qwen2.5-32B-shaped model
# with random weights ("off-policy"). Where these files are present they replace the 256-token figures above.
_B0FV, _B1FV = "gpu_full_size_b0_fullvocab_h200.json", "gpu_full_size_b1_fullvocab_h200.json"  # Qwen2.5's vocabulary
FULL_SIZE = {"eval": (_B0FV, _B1FV),
             "answers": (_B0FV, _B1FV),
             # the off-policy model's engine as jobs build it (LoRA off: it serves no adapter), per its
             # (off_policy.vllm_kv_cache_dtype, off_policy.vllm_quantization), Qwen2.5's vocabulary
             "off-policy": ("gpu_full_size_off_policy_fullvocab_h200.json",) * 2,
             "off-policy fp8 weights": ("gpu_full_size_off_policy_fp8w_fullvocab_h200.json",) * 2,
             # B1 measured (the long answer sets); B0 conditions fall back to the fp8-weights figure, noted
             "off-policy fp8 weights+kv": ("gpu_full_size_off_policy_fp8w_fp8kv_fullvocab_h200.json",) * 2,
             # A1B1 only, and at the tiny tokenizer's vocabulary (2026-12-05, before the others); the other
             # conditions fall back to the bf16 figure, noted
             "off-policy fp8 kv": ("gpu_full_size_off_policy_fp8_h200.json",) * 2}
OFF_POLICY_KINDS = {("auto", "none"): "off-policy", ("auto", "fp8"): "off-policy fp8 weights",
                    ("fp8", "none"): "off-policy fp8 kv", ("fp8", "fp8"): "off-policy fp8 weights+kv"}
_OFF_POLICY_LABELS = {"off-policy": "the 32B shape", "off-policy fp8 weights": "the 32B shape, fp8 weights",
                      "off-policy fp8 kv": "the 32B shape, fp8 KV cache",
                      "off-policy fp8 weights+kv": "the 32B shape, fp8 weights and KV cache"}
FULL_SIZE_OFF_POLICY_PARAMS = 32.8e9  # Qwen2.5-32B's shape, as measured
# A stage of a job's cells evaluated in one engine call (execution.job_eval per_job, pipeline through generate_many):
# per B1 condition, one cell's panel and then n cells' panels (each its own random adapter) in one call, in one
# engine (gpu_full_size_bench.py --eval-cells n, Qwen2.5's vocabulary). One cell's 2,500 answers were thought to
# leave the 1,024-sequence decode batch part empty at the end of each call; measured, two cells in a call gained 1.1%
# on A1B1 (A0B1 not run: no device time left; it keeps its one-cell figure).
STAGE_RESULTS = {"A1B1": "gpu_full_size_b1_stage_a1_h200.json"}


def full_size(kind: str, condition: str) -> Figure | None:
    """The full-size measurement of `kind` (eval, answers, off-policy) under an A x B condition; None where its
    result file is not there (an installed package without the repository's benchmarks)."""
    file = FULL_SIZE[kind][int(condition[3])]
    run = (_result_runs(file) or {}).get(f"{condition}:{'eval' if kind == 'eval' else 'answers'}")
    if run is None:
        return None
    return Figure(round(run["tokens_per_s"]), "tokens/s", _R + file,
                  f"{run['requests']:,} answers of {run['tokens'] // run['requests']:,} tokens")


def stage_speedup(condition: str) -> tuple[int, float, str] | None:
    """(n, tokens/s of n cells' panels in one call over one cell's, the result file) for a condition whose stage
    was measured; None where it was not (or its file is not there)."""
    file = STAGE_RESULTS.get(condition)
    runs = (_result_runs(file) or {}) if file else {}
    one = runs.get(f"{condition}:eval")
    stages = {int(k.rsplit("-x", 1)[1]): r for k, r in runs.items() if k.startswith(f"{condition}:eval-x")}
    if not one or not stages:
        return None
    n = max(stages)
    return n, stages[n]["tokens_per_s"] / one["tokens_per_s"], _R + file


def stage_shares(config: ScreenConfig, n: int) -> dict[str, float]:
    """Per A x B condition, the share of its cells that a GPU job evaluates in an engine call of at least `n`
    adapters: the known dispatches' jobs as design.group_jobs forms them, each split into stages as
    job.training.stages splits it (the A0B0 cells in their own stages where they train together). Empty where
    jobs evaluate cell by cell (job.training.by_stage)."""
    if not by_stage(config):
        return {}
    ex, together = config.execution, trains_together(config)
    counts = {c: [0, 0] for c in CONDITIONS}
    for cells in known_dispatches(config):
        for job in design.group_jobs(config, [c.id for c in cells], ex.cells_per_job, ex.max_parallel_cells):
            conds = [_cell_tokens(config, design.Cell.parse(c))[0] for c in job]
            shared = [i for i, c in enumerate(conds) if c == "A0B0"] if together else []
            for part, _ in stage_split([shared] if len(shared) > 1 else [], len(conds), ex.cells_per_stage):
                for i in part:
                    counts[conds[i]][len(part) >= n] += 1
    return {c: big / (small + big) for c, (small, big) in counts.items() if small + big}


def _with_stages(config: ScreenConfig, rate: Figure, condition: str, notes: list[str]) -> Figure:
    """A condition's one-cell evaluation figure, for the share of its cells evaluated in calls of at least the
    measured stage's n adapters, times the measured speed-up of n cells in one call (a call of more adapters is
    counted at n's, one of fewer at one cell's: both the slower side)."""
    measured = stage_speedup(condition)
    if measured is None:
        return rate
    n, speedup, file = measured
    share = stage_shares(config, n).get(condition, 0.0)
    if not share:
        return rate
    value = rate.value / (share / speedup + 1 - share)
    if share < 1:
        notes.append(f"eval {condition}: {share:.0%} of its cells in engine calls of at least {n} adapters"
                     f" (execution.cells_per_stage {config.execution.cells_per_stage}); the others at one cell's speed")
    return Figure(round(value), rate.unit, f"{rate.source}, {file}",
                  f"{rate.note}; x{speedup:.2f} for {n} cells' panels in one engine call"
                  + ("" if share == 1 else f", {share:.0%} of its cells"))


H200_VLLM_START_COLD = Figure(241, "s", _LM, "engine start with empty compile caches (torch.compile, CUDA graphs to 1,024)")
H200_VLLM_START_WARM = Figure(47, "s", _LG, "engine start with its compile cache warm (CUDA graphs to 1,024)")
# An engine's first sleep copies its weights into freshly pinned host memory: 10-16 s in the GPU job tests (16 with
# CUDA graphs to 1,024), one block at a time; since jobs pin host memory in threads (job.engines.pin_host_memory_in_threads)
# the full-size 7B engine's first sleep took 5.0 s (Qwen2.5's vocabulary, 14.2 GiB). PyTorch reads the setting when
# CUDA initialises (pinned_host_order_h100.txt): two later bench runs that read the GPU's properties first slept 12.5 and
# 17.7 s, as without it (the bench now sets it first, as a job does). Later sleeps 0.4 s, waking 0.8 s.
H200_FIRST_SLEEP = Figure(5, "s", _R + _B1FV,
                          "an engine's first sleep, host memory pinned in threads (12.5-17.7 s one block at a time);"
                          " later ones 0.4 s, waking 0.8 s")
# A job that makes off-policy answer sets starts a second engine, the off-policy model's (the 32B shape, LoRA off),
# measured twice on one fresh machine: every cache empty, then with execution.engine_cache_dir as the first left it.
H200_OFF_POLICY_START_COLD = Figure(215, "s", _R + "gpu_full_size_off_policy_cold_h200.json",
                                    "the off-policy engine's start (the 32B shape), compile and JIT caches empty")
H200_OFF_POLICY_START_WARM = Figure(41, "s", _R + "gpu_full_size_off_policy_warm_h200.json",
                                    "the off-policy engine's start (the 32B shape), its compile cache warm")
# With its weights in 8 bits (off_policy.vllm_quantization: fp8, quantized as vLLM loads them), measured the same way
# (cold, then warm, on one machine, the 32B shape at Qwen2.5's vocabulary). The warm start is 15 s longer than bf16's:
# the quantization on load (5.3 s), the FP8 kernels' graphs. An earlier cold start on another machine took 207 s.
H200_OFF_POLICY_START_COLD_FP8 = Figure(264, "s", _R + "gpu_full_size_off_policy_fp8w_start_cold_h200.json",
                                        "the off-policy engine's start with fp8 weights, compile and JIT caches empty")
H200_OFF_POLICY_START_WARM_FP8 = Figure(56, "s", _R + "gpu_full_size_off_policy_fp8w_start_warm_h200.json",
                                        "the off-policy engine's start with fp8 weights, its compile cache warm")
# On a GPU the off-policy model's engine runs in a process of its own (eps_screen.generation.engine_process: vLLM's
# sleep acts on every engine of a process), ended once the job's answer sets are made. Beyond the engine's start, that
# process cost 22.1 s to start (spawning, importing torch and vLLM) and 18.5 s to end on the H200
# (gpu_engines_test_h200.json). Since it is started ahead (engines.prepare: its imports, 21.4 s there, run while the
# base engine starts and generates) and ends at once (the driver takes its memory back with the process), the same
# test measured 0.24 s and 0.37 s (tests/gpu/test_gpu_engines.py). Before it had its own process, that engine would
# have slept in the job's process before training: 49.6 s for the 32B shape (gpu_full_size_bench.py's `leaving`).
H200_OFF_POLICY_PROCESS = Figure(0.6, "s", _R + "gpu_engines_test_h200_ahead.json",
                                 "the off-policy engine's own process, started ahead: its start beyond the engine's"
                                 " (0.24 s, its imports hidden) and its end (0.37 s)")
# While the off-policy engine runs, the training base waits in pinned host memory (engines.generator), so that engine
# has the card as gpu_full_size_bench.py gave it (the bench ran it alone: its figures are a job's only so). A job moves
# it once each way: 4.50 s to host (the first move pins the memory; later ones 0.32 s) and 0.35 s back, 14.2 GiB.
H200_BASE_ASIDE = Figure(4.9, "s", _R + "base_aside_h200.json",
                         "the training base to pinned host memory and back around the off-policy engine (the first"
                         " round: 4.50 s there, pinning; 0.35 s back)")
# The tiny preset on this project's 2-core CPU sandbox (tiny.yaml sizes).
CPU_TINY_TRAIN = Figure(4000, "tokens/s", _R + "cpu_backends.json", "train_lora, tiny.yaml cells")
CPU_TINY_GENERATE = Figure(1600, "tokens/s", _R + "cpu_backends.json", "transformers or vLLM, tiny model, one slab")

# Not measured (stated in notes wherever used).
PADDED_TAIL_FACTOR = 2.0  # transformers generate: a batch runs until its longest answer (cap/mean ~ 2 for B1)
POD_STARTUP_S = 180  # per GPU job: pod start, image pull, base model download or copy (no pod was ever timed)


@dataclass
class Estimate:
    gpu_hours: float
    cost_usd: float
    hardware: str
    hours: dict[str, float]  # train, eval, regimes, pre_screen, startup
    work: dict[str, float]  # cells, training tokens, generated tokens, ...
    figures: dict[str, dict]  # name -> {value, unit, source, note}
    notes: list[str] = field(default_factory=list)
    wall_hours: float | None = None  # the screen's first job's start to its last one's end (eps_screen.wall_clock)
    gpus_at_once: int | None = None
    job_hours: list[list[float]] = field(default_factory=list)  # each GPU job's, by dispatch (the pre-screen's first)

    @property
    def summary(self) -> str:
        h = self.hours
        parts = ", ".join(f"{k} {v:.2f}" for k, v in h.items() if v)
        return f"{self.gpu_hours:.1f} {self.hardware}-hours (${self.cost_usd:,.0f}): {parts}"

    def as_dict(self) -> dict:
        return {**asdict(self), "summary": self.summary}

    def lines(self) -> list[str]:
        out = [f"estimate: {self.summary}"]
        if self.wall_hours is not None:
            gpus = f"{self.gpus_at_once} GPU{'s' * (self.gpus_at_once != 1)}"
            out.append(f"wall clock: {self.wall_hours:.1f} h with {gpus} at once (execution.max_parallel_cells;"
                       " the phases in turn, start-ups included)")
        out += [f"  {name}: {f['value']:,.{0 if f['value'] >= 100 or f['value'] == int(f['value']) else 1}f} {f['unit']} ({f['source']}"
                f"{'; ' + f['note'] if f['note'] else ''})"
                for name, f in self.figures.items()]
        out += [f"  note: {n}" for n in self.notes]
        return out

    def generation_needed_for(self, hours: float) -> float | None:
        """Generation tokens/s (of a continuous-batching engine: no batch tail) at which the screen would fit in
        `hours`, training and start-up as estimated; None if those alone exceed it."""
        fixed = self.hours["train"] + self.hours["startup"]
        tokens = self.work["generated_tokens"]
        return tokens / ((hours - fixed) * 3600) if hours > fixed and tokens else None


def _cell_tokens(config: ScreenConfig, cell: design.Cell) -> tuple[str, float, float]:
    """(A x B condition, training tokens, evaluation answer tokens) of a cell under its own recipe."""
    rc, cond = (r := design.recipe(config, cell)).config, r.condition
    a, b = int(cond.long_system_prompt), int(cond.long_format)
    _, answer, seq = sequence_tokens(rc, a, b)
    examples = rc.data.positives + (
        0 if not cond.whole_answer_loss and rc.data.e0_negatives == "none" else rc.data.negatives)
    answers = (rc.eval.personas * rc.eval.questions + rc.eval.random_controls) * rc.eval.samples
    return f"A{a}B{b}", examples * seq * rc.training.epochs, answers * answer


def _regime_tokens(config: ScreenConfig, regime: design.Regime) -> tuple[str, float]:
    """(A x B condition, answer tokens) of a regime's answer set under its own recipe."""
    rc, cond = (rr := design.regime_recipe(config, regime)).config, rr.condition
    a, b = int(cond.long_system_prompt), int(cond.long_format)
    return f"A{a}B{b}", (rc.data.positives + rc.data.negatives) * sequence_tokens(rc, a, b)[1]


def _training_profile(config: ScreenConfig) -> tuple[str, list[str]]:
    t = config.training
    notes = []
    if t.gradient_checkpointing:
        profile = "padfree+liger+gc"
        if not t.packing:
            notes.append("gradient checkpointing without packing is not measured: padding-free figures used")
    elif not t.packing:
        profile = "padded+liger"
    elif getattr(t, "compile", False):
        profile = "padfree+fused+compile"
    else:
        profile = "padfree+liger+fused"
        notes.append("training.compile would make training ~10% faster (padfree+fused+compile figures)")
    return profile, notes


def _train_rates(config: ScreenConfig, profile: str, notes: list[str]) -> dict[str, Figure]:
    """Training tokens/s per A x B condition, each measured with the micro-batches that training.max_batch_tokens
    cuts the condition's batches into (a split batch trains slower); where that split was not measured, the
    whole-batch figure, noted."""
    t, rates = config.training, dict(H200_TRAIN[profile])
    file, variant = SPLIT_RESULTS.get(profile, (None, None))
    shares = speed_options(config, on_gpu=True)["share_prefix"]
    for c in CONDITIONS:
        seq = math.ceil(sequence_tokens(config, int(c[1]), int(c[3]))[2])
        micro, accum = split_batch(t.batch_size, 1, seq, t.max_batch_tokens)
        if micro < t.batch_size:
            run = measured_run(file, variant=variant, condition=c, micro_batch=micro, grad_accum=accum) if file else None
            if run:
                rates[c] = Figure(round(run["steady_tokens_per_s"]), "tokens/s", _R + file,
                                  f"{accum} micro-batches of {micro} a step, as training.max_batch_tokens cuts the batch")
            else:
                notes.append(f"train {c}: {accum} micro-batches of {micro} a step (training.max_batch_tokens "
                             f"{t.max_batch_tokens}) not measured under {profile}: its whole-batch figure used (faster)")
        if shares and c[1] == "1":
            rates[c] = _with_shared_prefixes(rates[c], c, micro, notes)
        # A0B0 (short, trained together by default) was not measured: its figure stays as before, the slower one
        if profile == "padfree+fused+compile" and c != "A0B0" and (shares or c[1] == "0"):
            rates[c] = _without_step_syncs(rates[c], c, micro, notes)
    return rates


def _without_step_syncs(rate: Figure, condition: str, micro: int, notes: list[str]) -> Figure:
    """A condition's figure times its measured speed-up from training without the Trainer's per-step syncs;
    unchanged, noted, where that condition or micro-batch was not measured."""
    runs = _result_runs(STEPS_RESULT) or {}
    before, after = runs.get(f"{condition}:before-again"), runs.get(f"{condition}:after-again")
    if not before or not after or after.get("micro_batch") != micro:
        notes.append(f"train {condition}: the step without per-step syncs not measured with micro-batches of {micro}:"
                     " counted as before")
        return rate
    speedup = before["s_per_step"] / after["s_per_step"]
    return Figure(round(rate.value * speedup), rate.unit, f"{rate.source}, {_R}{STEPS_RESULT}",
                  f"{rate.note + '; ' if rate.note else ''}x{speedup:.2f} without the Trainer's per-step syncs")


def _with_shared_prefixes(rate: Figure, condition: str, micro: int, notes: list[str]) -> Figure:
    """An A1 condition's figure times its measured speed-up from shared prefixes (the long system prompt computed
    once per micro-batch and persona); unchanged, noted, where that split was not measured."""
    runs = _result_runs(PREFIX_RESULT) or {}
    suffix = PREFIX_RUNS.get((condition, micro))
    plain, shared = runs.get(f"{condition}:plain{suffix}-again"), runs.get(f"{condition}:gather{suffix}-again")
    if suffix is None or not plain or not shared:
        notes.append(f"train {condition}: shared prefixes not measured with micro-batches of {micro}: counted as none")
        return rate
    speedup = plain["s_per_step"] / shared["s_per_step"]
    return Figure(round(rate.value * speedup), rate.unit, f"{rate.source}, {_R}{PREFIX_RESULT}",
                  f"x{speedup:.2f} with shared prefixes at qwen7b.yaml's persona mix")


def generate_rows(config: ScreenConfig, a: int) -> int:
    """Sequences per transformers generate() call for A=a prompts: the first call TransformersGenerator would make
    over a full batch of them (eval.batch_size prompts x samples, fewer under eval.batch_prompt_tokens)."""
    ev = config.eval
    prompt_tokens = math.ceil(sequence_tokens(config, a, 0)[0])
    start, end = batch_spans(ev.batch_size, ev.batch_size, ev.samples, [prompt_tokens] * ev.batch_size,
                             ev.batch_prompt_tokens)[0]
    return (end - start) * ev.samples


def gpu_jobs(config: ScreenConfig, n_multi: int | None = None, cells_per_job: int | None = None) -> int:
    """GPU jobs (pod or process start-ups) the screen dispatches, as flows/runtime/dispatch.py groups them: the
    pre-screen's, then each dispatch's (phase_sizes.dispatch_groups, `n_multi` multi-seed cells)."""
    ex = config.execution
    per_job = cells_per_job or ex.cells_per_job
    return 1 + sum(_jobs(config, n, per_job) for n in dispatch_groups(config, n_multi))


def _jobs(config: ScreenConfig, cells: int, per_job: int) -> int:
    """GPU jobs one dispatch of `cells` cells forms (design.group_jobs' count)."""
    ex = config.execution
    return math.ceil(cells / design.job_size(cells, per_job, ex.max_parallel_cells, ex.min_cells_per_job)) if cells else 0


def off_policy_engine_starts(config: ScreenConfig, n_multi: int | None = None) -> int:
    """GPU jobs that start the off-policy model's engine: those with an off-policy regime that no earlier dispatch
    made (as design.group_jobs groups them). Every multi-seed job is counted: its cells come from the slab's
    results, so which regimes they need is not known before."""
    if config.off_policy.kind != "model":
        return 0
    ex, made, starts = config.execution, set(), 0
    for cells in known_dispatches(config):
        for job in design.group_jobs(config, [c.id for c in cells], ex.cells_per_job, ex.max_parallel_cells):
            regimes = {design.regime_of(config, design.Cell.parse(c)) for c in job}
            starts += any(r.off_policy and r not in made for r in regimes)
        made |= {design.regime_of(config, c) for c in cells}
    multi = multiseed_count(config) if n_multi is None else n_multi
    return starts + _jobs(config, multi, ex.cells_per_job)


def fewest_jobs_cells_per_job(config: ScreenConfig, n_multi: int | None = None) -> int:
    """The smallest cells_per_job that gives the fewest GPU jobs for execution.max_parallel_cells GPUs: start-up
    is paid per job, and dispatch never makes a job so big that a GPU would sit idle, so beyond this value nothing
    changes. With job_eval per_cell a bigger job loses no more to a vanished pod (the resubmitted job finds its
    finished cells in the store and redoes only the one in flight); with per_job (the default) it loses the job's
    trainings that were not yet evaluated."""
    parallel = config.execution.max_parallel_cells
    return max(1, max(math.ceil(n / parallel) for n in dispatch_groups(config, n_multi)))


def at_gpu_counts(config: ScreenConfig, counts: tuple[int, ...] = (1, 2, 4, 8)) -> dict[int, Estimate]:
    """The estimate at each number of GPUs at once (execution.max_parallel_cells), each with the cells_per_job that
    gives it the fewest jobs: what more GPUs save in wall clock and cost in start-ups."""
    out = {}
    for n in counts:
        at = config.model_copy(update={"execution": config.execution.model_copy(update={"max_parallel_cells": n})})
        best = fewest_jobs_cells_per_job(at)
        out[n] = estimate(at.model_copy(update={"execution": at.execution.model_copy(update={"cells_per_job": best})}))
    return out


def off_policy_choices(config: ScreenConfig) -> dict[str, Estimate]:
    """The estimate under the other ways of making the off-policy answer sets, so a user sees what each trade costs
    or saves before renting: the local model's weights in the other precision, its KV cache in 8 bits, and answers
    that cost no GPU time (a file, or a hosted API as the original study used). Empty where the answers do not come
    from a local model's engine."""
    op = config.off_policy
    if op.kind != "model" or config.model.base.startswith("tiny"):
        return {}
    weights = "none" if op.vllm_quantization == "fp8" else "fp8"
    out = {f"off_policy.vllm_quantization: {weights}": estimate(config.with_sets({"off_policy.vllm_quantization": weights}))}
    if op.vllm_kv_cache_dtype == "auto":
        out["off_policy.vllm_kv_cache_dtype: fp8"] = estimate(config.with_sets({"off_policy.vllm_kv_cache_dtype": "fp8"}))
    outside = {"off_policy.kind": "jsonl", "off_policy.path": "answers.jsonl", "off_policy.model": None,
               "off_policy.vllm_kv_cache_dtype": "auto", "off_policy.vllm_quantization": "none"}
    out["off_policy.kind: jsonl or a hosted API"] = estimate(config.with_sets(outside))
    return out


def _off_policy_figure(config: ScreenConfig, condition: str, notes: list[str]) -> tuple[Figure | None, str]:
    """The off-policy model's answer-set figure under a condition and the FULL_SIZE kind it came from: that of the
    engine's settings (OFF_POLICY_KINDS), else, where those were not measured under the condition, the same weights
    with a bf16 KV cache, then full precision (each slower), noted."""
    op = config.off_policy
    wanted = (op.vllm_kv_cache_dtype, op.vllm_quantization) if op.kind == "model" else ("auto", "none")
    for settings in dict.fromkeys((wanted, ("auto", wanted[1]), ("auto", "none"))):
        figure = full_size(OFF_POLICY_KINDS[settings], condition)
        if figure:
            break
    if figure and settings != wanted:
        missing = " and ".join(name for name, want, got in (("an fp8 KV cache", wanted[0], settings[0]),
                                                            ("fp8 weights", wanted[1], settings[1])) if want != got)
        notes.append(f"off-policy answers {condition}: {missing} not measured there, the figure of "
                     f"{_OFF_POLICY_LABELS[OFF_POLICY_KINDS[settings]]} used (slower)")
    return figure, OFF_POLICY_KINDS[settings]


def _vllm_rates(config: ScreenConfig, figures: dict, notes: list[str]) -> tuple[dict, dict, dict | None]:
    """vLLM tokens/s per A x B condition: (evaluation through the cell's adapter, answer sets without one, the
    off-policy model's answer sets or None). Full-size figures where their files are there, else the 256-token
    figures by A level."""
    path = "merged" if config.eval.vllm_merge_adapter else "lora"
    gen, base, off, off_kinds = {}, {}, {}, {}
    full_eval = {c: full_size("eval", c) for c in CONDITIONS}
    for c in CONDITIONS:
        a, full = int(c[1]), full_eval[c]
        if full is None:
            gen[c] = H200_VLLM[path][a]
        elif path == "merged":
            ratio = H200_VLLM["merged"][a].value / H200_VLLM["lora"][a].value
            gen[c] = Figure(round(full.value * ratio), full.unit, f"{full.source}, {H200_VLLM['merged'][a].source}",
                            f"the LoRA figure x{ratio:.2f}, merged over LoRA at 256-token answers")
        else:
            gen[c] = _with_stages(config, full, c, notes)
        base[c] = full_size("answers", c) or H200_VLLM["base"][a]
        off[c], off_kind = _off_policy_figure(config, c, notes)
        off_kinds[off_kind] = None
        figures[f"generate {c} (vLLM, {path} adapter)"] = gen[c]
        figures[f"answers {c} (vLLM, no adapter)"] = base[c]
        if off[c] and config.off_policy.kind == "model":
            figures[f"off-policy answers {c} (vLLM, {_OFF_POLICY_LABELS[off_kind]})"] = off[c]
    if all(full_eval.values()):
        notes.append("vLLM figures at qwen7b.yaml's sizes on random weights, answers forced to "
                     f"{ANSWER_TOKENS[0]}/{ANSWER_TOKENS[1]} tokens (benchmarks/gpu_full_size_bench.py)")
        tiny_vocab = tiny_vocab_files(("eval", "answers", *off_kinds))
        if tiny_vocab:
            notes.append(f"vLLM figures of {', '.join(tiny_vocab)} with the tiny tokenizer's 2,048-token vocabulary:"
                         " at Qwen2.5's 152,064 the 7B's LoRA figures measured 5-8% slower"
                         f" ({FULL_SIZE['eval'][0]}, {FULL_SIZE['eval'][1]}), so these are a little faster than the"
                         " real model")
        if path == "merged":
            notes.append("merged adapters: not measured at full size (the LoRA figures times the 256-token ratio)")
    else:
        notes.append("vLLM figures measured with answers of up to 256 tokens on random weights (answers run near"
                     " their cap); B0's 50-token answers are likely slower per token (more prefill per token)")
    return gen, base, (off if all(off.values()) else None)


def _off_policy_rates(config: ScreenConfig, answer_rate: dict, off_rate: dict | None, tiny: bool,
                      notes: list[str]) -> tuple[dict, float]:
    """The off-policy model's tokens/s per condition and a factor on its tokens for a model of another size than
    the one measured: the measured 32B-shaped figures, else the base model's scaled by parameter count."""
    if config.off_policy.kind != "model" or not config.off_policy.model or tiny:
        return answer_rate, 1.0
    off_params = model_params(config.off_policy.model)
    if off_rate is not None:
        scale = off_params / FULL_SIZE_OFF_POLICY_PARAMS if off_params else 1.0
        if abs(scale - 1) <= 0.1:
            return off_rate, 1.0
        notes.append(f"off-policy answers from {config.off_policy.model}: the 32B-shaped model's measured figures"
                     f" scaled x{scale:.1f} by parameter count")
        return off_rate, scale
    if not off_params:
        return answer_rate, 1.0
    scale = off_params / REFERENCE_PARAMS
    notes.append(f"off-policy answers from {config.off_policy.model}: generation time scaled x{scale:.1f} by"
                 " parameter count (not measured; a 72B model in bf16 needs more than one H200's memory)"
                 if off_params > 60e9 else f"off-policy model scaled x{scale:.1f} by parameter count (not measured)")
    return answer_rate, scale


def estimate(config: ScreenConfig) -> Estimate:
    tiny = config.model.base.startswith("tiny")
    notes: list[str] = []
    figures: dict[str, Figure] = {}

    # --- the work ---------------------------------------------------------------------------------------------
    # Each cell's work under its own recipe (a factor may set the epochs, the data sizes or the eval panel); the
    # phase-3 cells are picked later: counted as the mean slab cell.
    smoke, slab = design.smoke_cells(config), design.all_slab_cells(config)
    folded = design.fold_over_cells(config)  # a Plackett-Burman slab's fold-over lies outside the slab
    cells = list({c.id: c for c in smoke + folded + slab}.values())
    n_multi = multiseed_count(config)
    n_cells = len(cells) + n_multi
    train_tokens = {c: 0.0 for c in CONDITIONS}
    eval_tokens = {c: 0.0 for c in CONDITIONS}
    cell_work = {c.id: _cell_tokens(config, c) for c in cells}
    for cond, train, answers in cell_work.values():
        train_tokens[cond] += train
        eval_tokens[cond] += answers
    for tokens in (train_tokens, eval_tokens):
        for c in CONDITIONS:
            tokens[c] *= n_cells / len(cells)
    answers_per_cell = (config.eval.personas * config.eval.questions + config.eval.random_controls) * config.eval.samples

    regimes = design.regimes(config, slab)
    regime_tokens = {"on": dict.fromkeys(CONDITIONS, 0.0), "off": dict.fromkeys(CONDITIONS, 0.0)}
    regime_work = {r: _regime_tokens(config, r) for r in regimes}
    for r, (cond, tokens) in regime_work.items():
        regime_tokens["off" if r.off_policy else "on"][cond] += tokens
    # Phase 3 re-runs at new seeds need their own answer sets: up to one per multi-seed cell, as the slabs' mix.
    for by_condition in regime_tokens.values():
        for c in CONDITIONS:
            by_condition[c] *= 1 + n_multi / max(1, len(regimes))
    if config.off_policy.kind != "model":  # a file or a hosted API: no GPU time
        regime_tokens["off"] = dict.fromkeys(CONDITIONS, 0.0)
    prescreen_tokens = dict.fromkeys(CONDITIONS, 0.0)
    for levels in design.pre_screen_conditions(config):
        cond = design.recipe_at(config, levels).condition
        a, b = int(cond.long_system_prompt), int(cond.long_format)
        prescreen_tokens[f"A{a}B{b}"] += answers_per_cell * sequence_tokens(config, a, b)[1]

    # --- the rates ----------------------------------------------------------------------------------------------
    if tiny:
        hardware = "CPU"
        train_rate = {c: CPU_TINY_TRAIN for c in CONDITIONS}
        gen_rate = dict.fromkeys(CONDITIONS, CPU_TINY_GENERATE)
        base_rate = off_rate = None
        figures["train (tiny, CPU)"] = CPU_TINY_TRAIN
        figures["generate (tiny, CPU)"] = CPU_TINY_GENERATE
        tail = 1.0
        startup_s = pre_screen_startup_s = 0.0
        notes.append("tiny model on the CPU: wall time of the in-process run, no GPU cost")
    else:
        hardware = "H200"
        profile, profile_notes = _training_profile(config)
        notes += profile_notes
        train_rate = _train_rates(config, profile, notes)
        together = measured_run(TOGETHER_RESULT, condition="A0B0", mode="together", cells=TOGETHER_CELLS)
        if trains_together(config) and together is not None:
            train_rate["A0B0"] = Figure(round(together["tokens_per_s"]), "tokens/s", _R + TOGETHER_RESULT,
                                        f"{TOGETHER_CELLS} cells of a job in shared passes")
            if most_together(config) < TOGETHER_CELLS:
                notes.append(f"A0B0 cells trained together measured {TOGETHER_CELLS} to a job; at most "
                             f"{most_together(config)} (execution.cells_per_job, cells_per_stage) share fewer passes"
                             " (slower than counted)")
        for c in CONDITIONS:
            label = "together" if c == "A0B0" and train_rate[c].source.endswith(TOGETHER_RESULT) else profile
            figures[f"train {c} ({label})"] = train_rate[c]
        backend = config.backend.generation
        base_rate = off_rate = None
        override = getattr(getattr(config, "estimate", None), "generate_tokens_per_s", None)
        vllm = backend in ("vllm", "auto")
        gen_rate = {}
        if override:
            gen_rate = dict.fromkeys(CONDITIONS, Figure(float(override), "tokens/s", "config estimate.generate_tokens_per_s"))
            figures["generate (config override)"] = gen_rate["A0B0"]
            tail = 1.0
        elif vllm:
            gen_rate, base_rate, off_rate = _vllm_rates(config, figures, notes)
            tail = 1.0  # continuous batching: no padded batch tail
        else:
            for a in (0, 1):
                rows = generate_rows(config, a)
                measured = H200_GENERATE[f"A{a}"]
                rate = measured[max([r for r in measured if r <= rows], default=min(measured))]
                gen_rate |= {c: rate for c in CONDITIONS if c[1] == str(a)}
                figures[f"generate A{a} (transformers, {rows} rows per call)"] = rate
                if rows >= H200_GENERATE_OOM_ROWS.get(f"A{a}", math.inf):
                    notes.append(f"transformers: {rows} sequences of A{a} prompts per generate() call; "
                                 f"{H200_GENERATE_OOM_ROWS[f'A{a}']} ran out of memory on the H200: set "
                                 "eval.batch_prompt_tokens (270000 fits) or lower eval.batch_size")
            tail = PADDED_TAIL_FACTOR
            notes.append(f"transformers batches run to their longest answer: x{tail} decode steps (assumed)")
        params = model_params(config.model.base)
        if params and abs(params / REFERENCE_PARAMS - 1) > 0.25:
            scale = REFERENCE_PARAMS / params
            train_rate = {c: Figure(f.value * scale, f.unit, f.source, f"scaled x{scale:.2f} by parameters") for c, f in train_rate.items()}
            gen_rate = {a: Figure(f.value * scale, f.unit, f.source, f"scaled x{scale:.2f} by parameters") for a, f in gen_rate.items()}
            if base_rate:
                base_rate = {a: Figure(f.value * scale, f.unit, f.source, f"scaled x{scale:.2f}") for a, f in base_rate.items()}
            notes.append(f"{config.model.base}: figures scaled from the 7.6B-parameter measurements by parameter count")
        startup_s = POD_STARTUP_S
        pre_screen_skips = 0.0  # the pre-screen's job trains nothing: nothing compiles, its engine never sleeps
        if vllm and not override:
            start = H200_VLLM_START_WARM if config.execution.engine_cache_dir else H200_VLLM_START_COLD
            figures["vLLM engine start"] = start
            figures["first engine sleep"] = H200_FIRST_SLEEP
            startup_s += start.value + H200_FIRST_SLEEP.value
            pre_screen_skips += H200_FIRST_SLEEP.value
            if not config.execution.engine_cache_dir:
                notes.append(f"execution.engine_cache_dir (a network volume) would start each job's engine in "
                             f"~{H200_VLLM_START_WARM.value:.0f} s instead of {H200_VLLM_START_COLD.value:.0f} s")
        if getattr(config.training, "compile", False):
            startup_s += H200_COMPILE_WARMUP_S.value
            pre_screen_skips += H200_COMPILE_WARMUP_S.value
            figures["compile warm-up"] = H200_COMPILE_WARMUP_S
        pre_screen_startup_s = startup_s - pre_screen_skips
        n_jobs = gpu_jobs(config, n_multi)
        best = fewest_jobs_cells_per_job(config, n_multi)
        notes.append(f"per GPU job {startup_s:.0f} s of start-up ({POD_STARTUP_S} s of it pod start and model"
                     f" download, assumed; the pre-screen's {pre_screen_startup_s:.0f} s: it trains nothing, so no"
                     f" compile warm-up or engine sleep); {n_jobs} jobs of up to execution.cells_per_job="
                     f"{config.execution.cells_per_job} cells")
        if best > config.execution.cells_per_job:
            fewer = gpu_jobs(config, n_multi, best)
            notes.append(f"execution.cells_per_job: {best} gives the fewest jobs for {config.execution.max_parallel_cells}"
                         f" GPUs ({fewer} instead of {n_jobs}: {(n_jobs - fewer) * startup_s / 3600:.1f} GPU-hours"
                         " less start-up)")

    train_s = sum(train_tokens[c] / train_rate[c].value for c in CONDITIONS)
    eval_s = sum(eval_tokens[c] * tail / gen_rate[c].value for c in CONDITIONS)
    # Answer sets and the pre-screen run without an adapter, each under its own prompt condition.
    answer_rate = base_rate or gen_rate
    off_rates, off_scale = _off_policy_rates(config, answer_rate, off_rate, tiny, notes)

    def cell_s(cell: design.Cell) -> float:
        """A cell's training and evaluation seconds at its condition's rates."""
        cond, train, answers = cell_work[cell.id]
        return train / train_rate[cond].value + answers * tail / gen_rate[cond].value

    def regime_s(r: design.Regime) -> float:
        """An answer set's seconds: the base model's, or the off-policy model's (no GPU time from a file or an API)."""
        if r not in regime_work:  # a regime no slab cell has, should a job hold one: counted once
            regime_work[r] = _regime_tokens(config, r)
        cond, tokens = regime_work[r]
        if not r.off_policy:
            return tokens * tail / answer_rate[cond].value
        return tokens * off_scale * tail / off_rates[cond].value if config.off_policy.kind == "model" else 0.0

    regimes_s = sum(map(regime_s, regimes)) * (1 + n_multi / max(1, len(regimes)))
    prescreen_s = sum(prescreen_tokens[c] * tail / answer_rate[c].value for c in CONDITIONS)
    jobs = gpu_jobs(config, n_multi)
    off_starts = 0 if tiny or override or not vllm else off_policy_engine_starts(config, n_multi)
    off_cold, off_warm = ((H200_OFF_POLICY_START_COLD_FP8, H200_OFF_POLICY_START_WARM_FP8)
                          if config.off_policy.vllm_quantization == "fp8"
                          else (H200_OFF_POLICY_START_COLD, H200_OFF_POLICY_START_WARM))
    off_start = off_warm if config.execution.engine_cache_dir else off_cold
    if off_starts:
        figures["off-policy engine start"] = off_start
        figures["off-policy engine process"] = H200_OFF_POLICY_PROCESS
        figures["training base aside"] = H200_BASE_ASIDE
        notes.append(f"{off_starts} of the {jobs} jobs start the off-policy model's engine too (the multi-seed jobs"
                     " counted as all needing it)")
        weights_gb = 2 * (model_params(config.off_policy.model) or FULL_SIZE_OFF_POLICY_PARAMS) / 1e9
        notes.append(f"not counted: fetching the off-policy model's ~{weights_gb:.0f} GB of weights in each of those"
                     f" {off_starts} jobs (its measured start made random weights on the GPU; the assumed pod start"
                     " covers the base model's download only; with a network volume they come from HF_HOME there)")
    # what a job pays for starting that engine
    off_job_s = off_start.value + H200_OFF_POLICY_PROCESS.value + H200_BASE_ASIDE.value
    if not tiny and not override and vllm and config.execution.engine_cache_dir:
        once = H200_VLLM_START_COLD.value - H200_VLLM_START_WARM.value + (
            off_cold.value - off_warm.value if off_starts else 0)
        notes.append(f"engine starts counted warm (execution.engine_cache_dir); while that directory is still empty"
                     f" the first start of each engine compiles: about {once:.0f} s more, once")
    hours = {
        "train": train_s / 3600,
        "eval": eval_s / 3600,
        "regimes": regimes_s / 3600,
        "pre_screen": prescreen_s / 3600,
        "startup": (pre_screen_startup_s + (jobs - 1) * startup_s + off_starts * off_job_s) / 3600,
    }
    # The multi-seed cells, not known before, each as the mean slab cell with an answer set of the mean regime.
    multiseed_cell_s = sum(map(cell_s, cells)) / len(cells) + sum(map(regime_s, regimes)) / max(1, len(regimes))
    costs = wall_clock.JobCosts(startup_s, off_job_s if off_starts else 0.0, cell_s, regime_s,
                                multiseed_cell_s)
    spans = [] if tiny else wall_clock.schedule(config, costs, pre_screen_startup_s + prescreen_s, n_multi)
    gpu_hours = sum(hours.values())
    work = {
        "cells": n_cells,
        "training_tokens": sum(train_tokens.values()),
        "eval_tokens": sum(eval_tokens.values()),
        "regime_tokens": sum(regime_tokens["on"].values()) + sum(regime_tokens["off"].values()),
        "pre_screen_tokens": sum(prescreen_tokens.values()),
    }
    # Answer tokens to generate, the off-policy model's counted at what they would cost the base model.
    off_as_base = sum(regime_tokens["off"][c] * off_scale * answer_rate[c].value / off_rates[c].value for c in CONDITIONS)
    work["generated_tokens"] = (work["eval_tokens"] + work["pre_screen_tokens"] + sum(regime_tokens["on"].values())
                                + off_as_base)
    notes.append(
        f"sequence lengths by rule of thumb: answers {ANSWER_TOKENS[0]}/{ANSWER_TOKENS[1]} tokens (B0/B1, docs/experiment.md),"
        f" {TOKENS_PER_WORD} tokens per word of the long system prompt"
    )
    cost = 0.0 if tiny else gpu_hours * config.execution.gpu_hourly_usd
    unmeasured = [g for g in config.execution.gpu_types if g != "NVIDIA H200"]
    if not tiny and unmeasured and config.execution.pool != "inprocess":
        notes.append(f"execution.gpu_types also allows {', '.join(unmeasured)}: only the H200 was measured, so hours"
                     f" and cost (${config.execution.gpu_hourly_usd}/h, execution.gpu_hourly_usd) assume H200 speed;"
                     " an A100 or H100 takes longer (less memory bandwidth, and the A100 less compute)")
    return Estimate(
        gpu_hours=gpu_hours,
        cost_usd=cost,
        hardware=hardware,
        hours=hours,
        work=work,
        figures={k: {"value": f.value, "unit": f.unit, "source": f.source, "note": f.note} for k, f in figures.items()},
        notes=notes,
        wall_hours=wall_clock.wall_hours(spans) if spans else None,
        gpus_at_once=None if tiny else config.execution.max_parallel_cells,
        job_hours=[[(end - start) / 3600 for start, end in jobs] for jobs in spans],
    )
