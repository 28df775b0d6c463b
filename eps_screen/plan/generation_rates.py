"""Generation tokens/s per A x B condition on the H200, from the measured figures (eps_screen/plan/figures.json): vLLM
at qwen7b.yaml's sizes (a cell's panel through its adapter, answer sets without one, the off-policy model's answer
sets under its engine's settings), the speed-up of a stage's panels in one engine call, and transformers' generate()
by sequences per call.
"""

from __future__ import annotations

import math

from eps_screen.generation.transformers_backend import batch_spans
from eps_screen.plan.figures import RESULTS, Figure, entries, entry, figure, keyed
from eps_screen.plan.screen_work import CONDITIONS, ScreenWork, screen_work
from eps_screen.plan.sequence_lengths import ANSWER_TOKENS, sequence_tokens
from eps_screen.spec import design
from eps_screen.spec.config import ScreenConfig, is_tiny
from eps_screen.train.stages import by_stage, stage_split, trains_together

# The off-policy engine's settings (off_policy.vllm_kv_cache_dtype, off_policy.vllm_quantization) -> the kind of
# its measured figures (figures.json "vllm/<kind>/<condition>") and how a note names them.
OFF_POLICY_KINDS = {("auto", "none"): "off-policy", ("auto", "fp8"): "off-policy fp8 weights",
                    ("fp8", "none"): "off-policy fp8 kv", ("fp8", "fp8"): "off-policy fp8 weights+kv"}
OFF_POLICY_LABELS = {"off-policy": "the 32B shape", "off-policy fp8 weights": "the 32B shape, fp8 weights",
                     "off-policy fp8 kv": "the 32B shape, fp8 KV cache",
                     "off-policy fp8 weights+kv": "the 32B shape, fp8 weights and KV cache"}


def full_size(kind: str, condition: str) -> Figure | None:
    """vLLM's figure at qwen7b.yaml's sizes of `kind` (eval, answers, an off-policy kind) under a condition."""
    return figure(f"vllm/{kind}/{condition}")


def tiny_vocab_files(kinds: tuple[str, ...] = ("eval", "answers", "off-policy")) -> list[str]:
    """The result files of those kinds' figures measured at the tiny tokenizer's 2,048-word vocabulary."""
    files = {e["result"]: None for k in kinds for e in keyed(f"vllm/{k}/").values() if e.get("vocab") != "fullvocab"}
    return list(files)


def stage_speedup(condition: str) -> tuple[int, float, str] | None:
    """(n, tokens/s of n cells' panels in one engine call over one cell's, its result file) for a condition whose
    stage was measured; None where it was not."""
    stages = {int(k): e for k, e in keyed(f"eval-stage/{condition}/").items()}
    if not stages:
        return None
    n = max(stages)
    return n, stages[n]["value"], RESULTS + stages[n]["result"]


def stage_shares(config: ScreenConfig, n: int, work: ScreenWork | None = None) -> dict[str, float]:
    """Per A x B condition, the share of its cells that a GPU job evaluates in an engine call of at least `n`
    adapters: the known dispatches' jobs as design.group_jobs forms them, each split into stages as
    train.stages.stages splits it (the A0B0 cells in their own stages where they train together). Empty where
    jobs evaluate cell by cell (train.stages.by_stage)."""
    if not by_stage(config):
        return {}
    ex, together = config.execution, trains_together(config)
    work = work or screen_work(config)
    counts = {c: [0, 0] for c in CONDITIONS}
    for cells in work.dispatches:
        for job in design.group_jobs(config, [c.id for c in cells], ex.cells_per_job, ex.max_parallel_cells):
            conds = [work.cells[c].condition for c in job]
            shared = [i for i, c in enumerate(conds) if c == "A0B0"] if together else []
            for part, _ in stage_split([shared] if len(shared) > 1 else [], len(conds), ex.cells_per_stage):
                for i in part:
                    counts[conds[i]][len(part) >= n] += 1
    return {c: big / (small + big) for c, (small, big) in counts.items() if small + big}


def _with_stages(config: ScreenConfig, rate: Figure, condition: str, work: ScreenWork, notes: list[str]) -> Figure:
    """A condition's one-cell evaluation figure, for the share of its cells evaluated in calls of at least the
    measured stage's n adapters, times the measured speed-up of n cells in one call (a call of more adapters is
    counted at n's, one of fewer at one cell's: both the slower side)."""
    measured = stage_speedup(condition)
    if measured is None:
        return rate
    n, speedup, file = measured
    share = stage_shares(config, n, work).get(condition, 0.0)
    if not share:
        return rate
    value = rate.value / (share / speedup + 1 - share)
    if share < 1:
        notes.append(f"eval {condition}: {share:.0%} of its cells in engine calls of at least {n} adapters"
                     f" (execution.cells_per_stage {config.execution.cells_per_stage}); the others at one cell's speed")
    return Figure(round(value), rate.unit, f"{rate.source}, {file}",
                  f"{rate.note}; x{speedup:.2f} for {n} cells' panels in one engine call"
                  + ("" if share == 1 else f", {share:.0%} of its cells"))


def off_policy_figure(config: ScreenConfig, condition: str, notes: list[str]) -> tuple[Figure | None, str]:
    """The off-policy model's answer-set figure under a condition and the kind it came from: that of the engine's
    settings (OFF_POLICY_KINDS), else, where those were not measured under the condition, the same weights with a
    bf16 KV cache, then full precision (each slower), noted."""
    op = config.off_policy
    wanted = (op.vllm_kv_cache_dtype, op.vllm_quantization) if op.kind == "model" else ("auto", "none")
    for settings in dict.fromkeys((wanted, ("auto", wanted[1]), ("auto", "none"))):
        found = full_size(OFF_POLICY_KINDS[settings], condition)
        if found:
            break
    if found and settings != wanted:
        missing = " and ".join(name for name, want, got in (("an fp8 KV cache", wanted[0], settings[0]),
                                                            ("fp8 weights", wanted[1], settings[1])) if want != got)
        notes.append(f"off-policy answers {condition}: {missing} not measured there, the figure of "
                     f"{OFF_POLICY_LABELS[OFF_POLICY_KINDS[settings]]} used (slower)")
    return found, OFF_POLICY_KINDS[settings]


def vllm_rates(config: ScreenConfig, work: ScreenWork, figures: dict, notes: list[str]) -> tuple[dict, dict, dict | None]:
    """vLLM tokens/s per A x B condition: (evaluation through the cell's adapter, answer sets without one, the
    off-policy model's answer sets or None). The figures at qwen7b.yaml's sizes; merged adapters at the LoRA figure
    times merged over LoRA as measured with 256-token answers."""
    path = "merged" if config.eval.vllm_merge_adapter else "lora"
    gen, base, off, off_kinds = {}, {}, {}, {}
    for c in CONDITIONS:
        a, full = int(c[1]), full_size("eval", c)
        if path == "merged":
            merged = figure(f"vllm-256/merged/A{a}")
            ratio = merged.value / figure(f"vllm-256/lora/A{a}").value
            gen[c] = Figure(round(full.value * ratio), full.unit, f"{full.source}, {merged.source}",
                            f"the LoRA figure x{ratio:.2f}, merged over LoRA at 256-token answers")
        else:
            gen[c] = _with_stages(config, full, c, work, notes)
        base[c] = full_size("answers", c)
        off[c], off_kind = off_policy_figure(config, c, notes)
        off_kinds[off_kind] = None
        figures[f"generate {c} (vLLM, {path} adapter)"] = gen[c]
        figures[f"answers {c} (vLLM, no adapter)"] = base[c]
        if off[c] and config.off_policy.kind == "model" and not is_tiny(config.off_policy.model or ""):
            figures[f"off-policy answers {c} (vLLM, {OFF_POLICY_LABELS[off_kind]})"] = off[c]
    notes.append("vLLM figures at qwen7b.yaml's sizes on random weights, answers forced to "
                 f"{ANSWER_TOKENS[0]}/{ANSWER_TOKENS[1]} tokens (benchmarks/gpu_full_size_bench.py)")
    tiny_vocab = tiny_vocab_files(("eval", "answers", *off_kinds))
    if tiny_vocab:
        eval_files = [full_size("eval", c).source.removeprefix(RESULTS) for c in ("A0B0", "A0B1")]
        notes.append(f"vLLM figures of {', '.join(tiny_vocab)} with the tiny tokenizer's 2,048-token vocabulary:"
                     " at Qwen2.5's 152,064 the 7B's LoRA figures measured 5-8% slower"
                     f" ({eval_files[0]}, {eval_files[1]}), so these are a little faster than the real model")
    if path == "merged":
        notes.append("merged adapters: not measured at full size (the LoRA figures times the 256-token ratio)")
    return gen, base, (off if all(off.values()) else None)


def generate_rows(config: ScreenConfig, a: int) -> int:
    """Sequences per transformers generate() call for A=a prompts: the first call TransformersGenerator would make
    over a full batch of them (eval.batch_size prompts x samples, fewer under eval.batch_prompt_tokens)."""
    ev = config.eval
    prompt_tokens = math.ceil(sequence_tokens(config, a, 0)[0])
    start, end = batch_spans(ev.batch_size, ev.batch_size, ev.samples, [prompt_tokens] * ev.batch_size,
                             ev.batch_prompt_tokens)[0]
    return (end - start) * ev.samples


def transformers_rates(config: ScreenConfig, figures: dict, notes: list[str]) -> dict[str, Figure]:
    """transformers generate() tokens/s per condition: the figure measured at the most sequences per call not above
    the config's (decode is bound by Python per step, so more rows are nearly free until memory runs out)."""
    rates = {}
    for a in (0, 1):
        rows = generate_rows(config, a)
        measured = {int(r): k for r, k in ((k.rsplit("/", 1)[1], k) for k in entries()
                                             if k.startswith(f"transformers-generate/A{a}/"))}
        rate = figure(measured[max([r for r in measured if r <= rows], default=min(measured))])
        rates |= {c: rate for c in CONDITIONS if c[1] == str(a)}
        figures[f"generate A{a} (transformers, {rows} rows per call)"] = rate
        oom = entry(f"transformers-generate-oom/A{a}")
        if oom and rows >= oom["value"]:
            notes.append(f"transformers: {rows} sequences of A{a} prompts per generate() call; "
                         f"{oom['value']} ran out of memory on the H200: set "
                         "eval.batch_prompt_tokens (270000 fits) or lower eval.batch_size")
    return rates
