"""GPU-hours and cost of a screen: what `eps-screen validate` prints before renting.

The work (screen_work: each cell of every phase under its own recipe, answer sets, the pre-screen's conditions;
GPU jobs as phase_sizes groups them) is divided by figures measured on the H200 test machine
(eps_screen/plan/figures.json; training_rates, generation_rates), carried over to the config's model by its shape
(model_scaling). Where no measurement exists the estimate says so in `notes` and uses the nearest measured figure. The
tiny preset runs on the CPU: its figures are CPU measurements and its cost is zero.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from eps_screen.models.shape import model_params
from eps_screen.plan import wall_clock
from eps_screen.plan.figures import Figure, figure
from eps_screen.plan.generation_rates import transformers_rates, vllm_rates
from eps_screen.plan.memory import REFERENCE_PARAMS
from eps_screen.plan.model_scaling import scale_to_model
from eps_screen.spec import design
from eps_screen.spec.config import ScreenConfig, is_tiny
from eps_screen.train.stages import by_stage
from eps_screen.plan.phase_sizes import (
    fewest_jobs_cells_per_job,
    gpu_jobs,
    off_policy_engine_starts,
)
from eps_screen.plan.screen_work import CONDITIONS, ScreenWork, screen_work
from eps_screen.plan.sequence_lengths import ANSWER_TOKENS, TOKENS_PER_WORD
from eps_screen.plan.training_rates import train_rates, training_profile

SHORT_SCREEN_HOURS = 2.0  # below this validate also prints each part in GPU-minutes


@dataclass
class Estimate:
    gpu_hours: float
    cost_usd: float
    hardware: str
    hours: dict[str, float]  # train, eval, regimes, pre_screen, startup
    work: dict[str, float]  # cells, training tokens, generated tokens, ...
    figures: dict[str, dict]  # name -> {value, unit, source, note}
    notes: list[str] = field(default_factory=list)
    wall_hours: float | None = None  # the screen's first job's start to its last one's end (eps_screen.plan.wall_clock)
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
        if self.hardware != "CPU" and self.gpu_hours < SHORT_SCREEN_HOURS:  # parts to hold a short run against
            names = {"train": "train", "eval": "eval", "regimes": "answer sets", "pre_screen": "pre-screen",
                     "startup": "start-up"}
            out.append("GPU-minutes: " + ", ".join(f"{names[k]} {v * 60:.1f}" for k, v in self.hours.items()))
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


def _off_policy_rates(config: ScreenConfig, answer_rate: dict, off_rate: dict | None, tiny: bool,
                      notes: list[str]) -> tuple[dict, float]:
    """The off-policy model's tokens/s per condition and a factor on its tokens for a model of another size than
    the one measured: the measured 32B-shaped figures, else the base model's scaled by parameter count."""
    if config.off_policy.kind != "model" or not config.off_policy.model or tiny:
        return answer_rate, 1.0
    if is_tiny(config.off_policy.model):
        notes.append(f"off-policy answers from {config.off_policy.model} (a tiny model eps-screen builds): at the base"
                     " model's answer speed, a bound (its engine's per-step work is no more)")
        return answer_rate, 1.0
    off_params = model_params(config.off_policy.model)
    measured = figure("shape/off-policy-measured").value
    if off_rate is not None:
        scale = off_params / measured if off_params else 1.0
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


def exposed_evaluation_s(eval_s: float, train_s: float, jobs: int, stages: int) -> float:
    """The evaluation the card waits for when each stage's evaluation runs beside the next stage's training: what
    the training does not cover, and at least each job's last stage (one average stage a job)."""
    return max(eval_s - train_s, eval_s * min(1.0, jobs / stages))


def estimate(config: ScreenConfig, work: ScreenWork | None = None) -> Estimate:
    """The estimate of a screen's `work` (screen_work(config) where not given: a work counted for this config, or
    for one that differs from it only in execution or off_policy settings)."""
    work = work or screen_work(config)
    tiny = config.model.base.startswith("tiny")
    notes: list[str] = []
    figures: dict = {}
    n_multi = work.n_multi
    train_tokens, eval_tokens = work.by_condition("train"), work.by_condition("answers")
    regime_tokens = work.answer_set_tokens()
    if config.off_policy.kind != "model":  # a file or a hosted API: no GPU time
        regime_tokens["off"] = dict.fromkeys(CONDITIONS, 0.0)
    prescreen_tokens = work.pre_screen_tokens

    # --- the rates ----------------------------------------------------------------------------------------------
    base_rate = off_rate = base_engine_start = None
    vllm = override = False
    if tiny:
        hardware, tail = "CPU", 1.0
        train_fig, gen_fig = figure("cpu-tiny/train"), figure("cpu-tiny/generate")
        train_rate, gen_rate = dict.fromkeys(CONDITIONS, train_fig), dict.fromkeys(CONDITIONS, gen_fig)
        figures["train (tiny, CPU)"], figures["generate (tiny, CPU)"] = train_fig, gen_fig
        startup_s = pre_screen_startup_s = warm_startup_s = host_first_s = 0.0
        notes.append("tiny model on the CPU: wall time of the in-process run, no GPU cost")
    else:
        hardware = "H200"
        profile, profile_notes = training_profile(config)
        notes += profile_notes
        train_rate = train_rates(config, profile, notes)
        for c in CONDITIONS:
            label = "together" if c == "A0B0" and "shared passes" in train_rate[c].note else profile
            figures[f"train {c} ({label})"] = train_rate[c]
        override = config.estimate.generate_tokens_per_s
        vllm = config.backend.generation in ("vllm", "auto")
        if override:
            gen_rate = dict.fromkeys(CONDITIONS, Figure(float(override), "tokens/s", "config estimate.generate_tokens_per_s"))
            figures["generate (config override)"] = gen_rate["A0B0"]
            tail = 1.0
        elif vllm:
            gen_rate, base_rate, off_rate = vllm_rates(config, work, figures, notes)
            tail = 1.0  # continuous batching: no padded batch tail
        else:
            gen_rate = transformers_rates(config, figures, notes)
            tail = figure("assumed/padded-tail").value
            notes.append(f"transformers batches run to their longest answer: x{tail} decode steps (assumed)")
        scaled = scale_to_model(config, train_rate, gen_rate, base_rate, vllm and not override)
        if scaled.notes:  # another model's shape: every rate and its figure carried over
            new = {id(old): scaled_figure for before, after in ((train_rate, scaled.train), (gen_rate, scaled.generate),
                                                                (base_rate or {}, scaled.answers or {}))
                   for old, scaled_figure in zip(before.values(), after.values())}
            figures = {k: new.get(id(f), f) for k, f in figures.items()}
            train_rate, gen_rate, base_rate = scaled.train, scaled.generate, scaled.answers
            notes += scaled.notes
        # a local-gpu job starts a process on a machine that is up; a pod must start, pull and download first
        local = config.execution.pool == "local-gpu"
        job_start = figure("start/local-gpu-job" if local else "assumed/pod-startup")
        # on a machine that is up, only the screen's first job converts the weights and fills the OS file cache
        later_start = figure("start/local-gpu-job-later") if local else job_start
        if local:
            figures["local-gpu job start"], figures["local-gpu later job start"] = job_start, later_start
        pod = later_start.value
        startup_s = pod
        pre_screen_skips = 0.0  # the pre-screen's job trains nothing: nothing compiles, its engine never sleeps
        if vllm and not override:
            cold, warm = figure(f"{scaled.engine}-cold"), figure(f"{scaled.engine}-warm")
            start = warm if config.execution.engine_cache_dir else cold
            sleep = figure("start/first-sleep")
            if scaled.sleep_factor != 1:
                sleep = Figure(sleep.value * scaled.sleep_factor, sleep.unit, sleep.source,
                                    f"the 7B's x{scaled.sleep_factor:.2f} by the weights' size")
            figures["vLLM engine start"], figures["first engine sleep"] = start, sleep
            base_engine_start = start
            startup_s += start.value + sleep.value
            pre_screen_skips += sleep.value
            if not config.execution.engine_cache_dir:
                notes.append(f"execution.engine_cache_dir (a network volume) would start each job's engine in "
                             f"~{warm.value:.0f} s instead of {cold.value:.0f} s")
        if config.training.compile:
            warmup = figure(scaled.compile_warmup)
            startup_s += warmup.value
            pre_screen_skips += warmup.value
            figures["compile warm-up"] = warmup
        pre_screen_startup_s = startup_s - pre_screen_skips + job_start.value - later_start.value
        # A local-gpu worker runs its jobs in one job host (flows/runtime/job_host.py), which keeps the engines, the
        # trainers and their compiled code up: a job on a GPU that ran one before starts at once (SmolLM2's smoke and
        # slab jobs on an H100: BENCHMARKS.md). What the pre-screen's job skipped, its GPU's first training job pays.
        if local:
            warm_startup_s, host_first_s = 0.0, pre_screen_skips
            notes.append(f"local-gpu: each GPU's later jobs run in its job host, with the engines and trainers the"
                         f" first left up: no start-up but the off-policy engine's; the pre-screen's GPU pays"
                         f" {host_first_s:.0f} s more once (what its job skipped)")
        else:
            warm_startup_s, host_first_s = startup_s, 0.0
        n_jobs = gpu_jobs(config, n_multi, dispatches=work.dispatches)
        best = fewest_jobs_cells_per_job(config, n_multi, work.dispatches)
        began = (f"the job's process, imports and base model, measured on the local-gpu pool; the screen's first"
                 f" job's {job_start.value:.0f} s" if local else "pod start and model download, assumed")
        each = "a GPU's first job" if local else "per GPU job"
        notes.append(f"{each}: {startup_s:.0f} s of start-up ({pod:.0f} s of it {began}; the pre-screen's"
                     f" {pre_screen_startup_s:.0f} s: it trains nothing, so no compile warm-up or engine sleep);"
                     f" {n_jobs} jobs of up to execution.cells_per_job={config.execution.cells_per_job} cells")
        fewer = gpu_jobs(config, n_multi, best, work.dispatches)
        if fewer < n_jobs:
            notes.append(f"execution.cells_per_job: {best} gives the fewest jobs for {config.execution.max_parallel_cells}"
                         f" GPUs ({fewer} instead of {n_jobs}: {(n_jobs - fewer) * startup_s / 3600:.1f} GPU-hours"
                         " less start-up)")

    train_s = sum(train_tokens[c] / train_rate[c].value for c in CONDITIONS)
    eval_s = sum(eval_tokens[c] * tail / gen_rate[c].value for c in CONDITIONS)
    # With trainer processes a stage's evaluation runs while the next stage trains (eps_screen.run.pipeline): only
    # what is longer than the training it runs beside costs the card, and at least each job's last stage's.
    beside = not tiny and config.training.processes > 1 and by_stage(config)
    if beside:
        stages_total = max(1, -(-work.distinct_cells // config.execution.cells_per_stage))
        jobs_total = gpu_jobs(config, n_multi, dispatches=work.dispatches)
        exposed = exposed_evaluation_s(eval_s, train_s, jobs_total, stages_total)
        notes.append(f"training.processes: each stage's evaluation runs beside the next stage's training; evaluation"
                     f" counted {exposed / 60:.1f} of its {eval_s / 60:.1f} GPU-minutes (what the training does not"
                     " cover, and at least each job's last stage)")
        eval_s = exposed
    # Answer sets and the pre-screen run without an adapter, each under its own prompt condition.
    answer_rate = base_rate or gen_rate
    off_rates, off_scale = _off_policy_rates(config, answer_rate, off_rate, tiny, notes)

    def cell_seconds(cell_id: str) -> float:
        """A cell's training and evaluation seconds at its condition's rates."""
        w = work.cells[cell_id]
        train, evaluate = (w.train_tokens / train_rate[w.condition].value,
                           w.answer_tokens * tail / gen_rate[w.condition].value)
        return max(train, evaluate) if beside else train + evaluate

    def regime_s(r: design.Regime) -> float:
        """An answer set's seconds: the base model's, or the off-policy model's (no GPU time from a file or an API)."""
        cond, tokens = work.regime(config, r)
        if not r.off_policy:
            return tokens * tail / answer_rate[cond].value
        return tokens * off_scale * tail / off_rates[cond].value if config.off_policy.kind == "model" else 0.0

    regimes = work.regimes
    regimes_s = sum(map(regime_s, regimes)) * (1 + n_multi / max(1, len(regimes)))
    prescreen_s = sum(prescreen_tokens[c] * tail / answer_rate[c].value for c in CONDITIONS)
    jobs = gpu_jobs(config, n_multi, dispatches=work.dispatches)
    fresh_jobs = max(0, min(config.execution.max_parallel_cells, jobs - 1) - 1)  # the others start warm
    off_starts = 0 if tiny or override or not vllm else off_policy_engine_starts(config, n_multi, work.dispatches)
    fp8 = "-fp8" if config.off_policy.vllm_quantization == "fp8" else ""
    off_cold, off_warm = figure(f"start/off-policy{fp8}-cold"), figure(f"start/off-policy{fp8}-warm")
    off_start = off_warm if config.execution.engine_cache_dir else off_cold
    tiny_off = config.off_policy.kind == "model" and is_tiny(config.off_policy.model or "")
    if tiny_off and base_engine_start is not None:  # a tiny model's engine: started as the base model's is
        off_start = base_engine_start
    process, aside = figure("start/off-policy-process"), figure("start/base-aside")
    if off_starts:
        figures["off-policy engine start"] = off_start
        figures["off-policy engine process"] = process
        figures["training base aside"] = aside
        notes.append(f"{off_starts} of the {jobs} jobs start the off-policy model's engine too (the multi-seed jobs"
                     " counted as all needing it)")
        weights_gb = 2 * (model_params(config.off_policy.model) or figure("shape/off-policy-measured").value) / 1e9
        if not tiny_off:  # a tiny model is built where it runs: nothing to fetch
            notes.append(f"not counted: fetching the off-policy model's ~{weights_gb:.0f} GB of weights in each of those"
                         f" {off_starts} jobs (its measured start made random weights on the GPU; the assumed pod start"
                         " covers the base model's download only; with a network volume they come from HF_HOME there)")
    # what a job pays for starting that engine
    off_job_s = off_start.value + process.value + aside.value
    if not tiny and not override and vllm and config.execution.engine_cache_dir:
        off_once = cold.value - warm.value if tiny_off else off_cold.value - off_warm.value
        once = cold.value - warm.value + (off_once if off_starts else 0)
        notes.append(f"engine starts counted warm (execution.engine_cache_dir); while that directory is still empty"
                     f" the first start of each engine compiles: about {once:.0f} s more, once")
    first_gpu_s = pre_screen_startup_s + host_first_s  # the pre-screen's GPU's start-ups, its later jobs' included
    hours = {
        "train": train_s / 3600,
        "eval": eval_s / 3600,
        "regimes": regimes_s / 3600,
        "pre_screen": prescreen_s / 3600,
        "startup": (first_gpu_s + fresh_jobs * startup_s + (jobs - 1 - fresh_jobs) * warm_startup_s
                    + off_starts * off_job_s) / 3600,
    }
    # The multi-seed cells, not known before, each as the mean slab cell with an answer set of the mean regime.
    multiseed_cell_s = (sum(map(cell_seconds, work.cells)) / len(work.cells)
                        + sum(map(regime_s, regimes)) / max(1, len(regimes)))
    costs = wall_clock.JobCosts(startup_s, warm_startup_s, off_job_s if off_starts else 0.0,
                                lambda cell: cell_seconds(cell.id), regime_s, multiseed_cell_s)
    spans = [] if tiny else wall_clock.schedule(config, costs, first_gpu_s + prescreen_s, n_multi,
                                                      work.dispatches)
    gpu_hours = sum(hours.values())
    totals = {
        "cells": work.distinct_cells,
        "training_tokens": sum(train_tokens.values()),
        "eval_tokens": sum(eval_tokens.values()),
        "regime_tokens": sum(regime_tokens["on"].values()) + sum(regime_tokens["off"].values()),
        "pre_screen_tokens": sum(prescreen_tokens.values()),
    }
    # Answer tokens to generate, the off-policy model's counted at what they would cost the base model.
    off_as_base = sum(regime_tokens["off"][c] * off_scale * answer_rate[c].value / off_rates[c].value for c in CONDITIONS)
    totals["generated_tokens"] = (totals["eval_tokens"] + totals["pre_screen_tokens"] + sum(regime_tokens["on"].values())
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
        work=totals,
        figures={k: {"value": f.value, "unit": f.unit, "source": f.source, "note": f.note} for k, f in figures.items()},
        notes=notes,
        wall_hours=wall_clock.wall_hours(spans) if spans else None,
        gpus_at_once=None if tiny else config.execution.max_parallel_cells,
        job_hours=[[(end - start) / 3600 for start, end in jobs] for jobs in spans],
    )


def at_gpu_counts(config: ScreenConfig, counts: tuple[int, ...] = (1, 2, 4, 8),
                  work: ScreenWork | None = None) -> dict[int, Estimate]:
    """The estimate at each number of GPUs at once (execution.max_parallel_cells), each with the cells_per_job that
    gives it the fewest jobs: what more GPUs save in wall clock and cost in start-ups."""
    work = work or screen_work(config)
    out = {}
    for n in counts:
        at = config.model_copy(update={"execution": config.execution.model_copy(update={"max_parallel_cells": n})})
        best = fewest_jobs_cells_per_job(at, dispatches=work.dispatches)
        out[n] = estimate(at.model_copy(update={"execution": at.execution.model_copy(update={"cells_per_job": best})}),
                          work)
    return out


def off_policy_choices(config: ScreenConfig, work: ScreenWork | None = None) -> dict[str, Estimate]:
    """The estimate under the other ways of making the off-policy answer sets, so a user sees what each trade costs
    or saves before renting: the local model's weights in the other precision, its KV cache in 8 bits, and answers
    that cost no GPU time (a file, or a hosted API as the original study used). Empty where the answers do not come
    from a local model's engine."""
    op = config.off_policy
    if op.kind != "model" or config.model.base.startswith("tiny"):
        return {}
    work = work or screen_work(config)
    weights = "none" if op.vllm_quantization == "fp8" else "fp8"
    out = {f"off_policy.vllm_quantization: {weights}":
           estimate(config.with_sets({"off_policy.vllm_quantization": weights}), work)}
    if op.vllm_kv_cache_dtype == "auto":
        out["off_policy.vllm_kv_cache_dtype: fp8"] = estimate(config.with_sets({"off_policy.vllm_kv_cache_dtype": "fp8"}), work)
    outside = {"off_policy.kind": "jsonl", "off_policy.path": "answers.jsonl", "off_policy.model": None,
               "off_policy.vllm_kv_cache_dtype": "auto", "off_policy.vllm_quantization": "none"}
    out["off_policy.kind: jsonl or a hosted API"] = estimate(config.with_sets(outside), work)
    return out
