"""The GPU-hours estimate: computed from measured figures that name their result files."""

from __future__ import annotations

import json

import pytest

from eps_screen.plan.cost_estimate import estimate
from eps_screen.plan.figures import RESULTS, entry, figure
from eps_screen.plan.generation_rates import OFF_POLICY_KINDS, full_size
from eps_screen.plan.phase_sizes import fewest_jobs_cells_per_job, gpu_jobs, off_policy_engine_starts
from eps_screen.plan.screen_work import CONDITIONS
from eps_screen.spec.config import load_config
from eps_screen.spec.design import Cell
from tests.conftest import CONFIGS, ROOT


def _qwen(**training):
    config = load_config(CONFIGS / "qwen7b.yaml")
    return config.model_copy(update={"training": config.training.model_copy(update=training)}) if training else config


def test_qwen7b_estimate_cites_its_figures():
    est = estimate(_qwen())
    assert est.hardware == "H200" and est.gpu_hours > 0
    assert est.cost_usd == est.gpu_hours * 3.5
    assert set(est.hours) == {"train", "eval", "regimes", "pre_screen", "startup"}
    assert est.work["cells"] == 114  # 96 slab cells (the 8 smoke cells among them) + 18 multi-seed
    for name, fig in est.figures.items():
        assert fig["value"] > 0, name
        path = fig["source"].split(",")[0]
        assert (ROOT / path).exists(), f"{name}: {path} missing"
    # GPU pools generate with vLLM: its figures, measured on the H200, not transformers' floor
    assert any(f["source"].startswith("benchmarks/results/gpu_lora_") for f in est.figures.values())
    assert not any("transformers" in name for name in est.figures)
    d = est.as_dict()
    assert d["cost_usd"] == est.cost_usd and "H200-hours" in d["summary"]


def test_levers_and_sources_move_the_estimate():
    base = estimate(_qwen(compile=False))
    compiled = estimate(_qwen(compile=True))
    checkpointed = estimate(_qwen(compile=False, gradient_checkpointing=True))
    assert compiled.hours["train"] < base.hours["train"] < checkpointed.hours["train"]
    config = _qwen()
    jsonl = config.model_copy(update={"off_policy": config.off_policy.model_copy(update={"kind": "jsonl", "path": "a.jsonl"})})
    assert estimate(jsonl).hours["regimes"] < base.hours["regimes"]
    hosted = config.model_copy(update={"off_policy": config.off_policy.model_copy(update={"kind": "anthropic", "model": "claude-x"})})
    assert estimate(hosted).hours["regimes"] == estimate(jsonl).hours["regimes"]  # a hosted API costs no GPU time


def test_generation_override_and_the_rate_a_budget_needs():
    config = _qwen(compile=True)
    needed = estimate(config).generation_needed_for(7.0)
    assert needed and needed > 10_000
    fast = config.model_copy(update={"estimate": type("E", (), {"generate_tokens_per_s": needed})()})
    # At exactly the needed rate (no batch tail) the screen takes the budget, give or take the off-policy model.
    assert estimate(fast).gpu_hours < estimate(config).gpu_hours


def test_tiny_preset_costs_nothing():
    est = estimate(load_config(CONFIGS / "tiny.yaml"))
    assert est.hardware == "CPU" and est.cost_usd == 0 and est.gpu_hours < 2


def _off_policy_job_s(config) -> float:
    """What a job that makes off-policy answer sets pays beyond the others: that engine's warm start (with its
    weights in 8 bits or not), its process, and the training base's moves to host memory and back around it."""
    fp8 = "-fp8" if config.off_policy.vllm_quantization == "fp8" else ""
    return sum(figure(k).value for k in (f"start/off-policy{fp8}-warm", "start/off-policy-process", "start/base-aside"))


def _start_up_per_job(config, est) -> float:
    """Seconds of start-up per cell job, less the off-policy engine's start in the jobs that make off-policy answers
    (the pre-screen's job, which trains nothing, counted with the warm-ups it skips)."""

    off = off_policy_engine_starts(config) * _off_policy_job_s(config)
    skipped = sum(est.figures[k]["value"] for k in ("compile warm-up", "first engine sleep") if k in est.figures)
    return (est.hours["startup"] * 3600 - off + skipped) / gpu_jobs(config)


def test_start_up_counts_the_jobs_dispatch_will_form():
    from eps_screen.spec.design import group_jobs

    config = load_config(CONFIGS / "qwen7b.yaml")
    config = config.model_copy(update={"execution": config.execution.model_copy(
        update={"cells_per_job": 4, "max_parallel_cells": 8, "min_cells_per_job": 1})})
    # the same grouping as dispatch: pre-screen 1, smoke 8 cells -> 8 jobs (8 GPUs), the three slabs' 88 cells
    # left (one dispatch) -> 22 jobs of 4, 18 multi-seed cells -> 6 jobs
    def jobs(n: int) -> int:
        return len(group_jobs(config, [f"s{i:02d}-A0B0C0D0E0-s1" for i in range(n)], 4, 8))

    assert gpu_jobs(config, 18) == 1 + jobs(8) + jobs(88) + jobs(18) == 37
    one_per_job = config.model_copy(update={"execution": config.execution.model_copy(update={"cells_per_job": 1})})
    batched, single = estimate(config), estimate(one_per_job)
        # the same start-up per job, and the off-policy engine's start in each job that makes off-policy answers
    assert _start_up_per_job(one_per_job, single) == pytest.approx(_start_up_per_job(config, batched))
    assert off_policy_engine_starts(one_per_job) > off_policy_engine_starts(config) > 0
    # one cell per job trains alone and is evaluated in a call of its own: the A0B0 cells, which share passes in
    # bigger jobs, take longer, and the A1B1 cells, whose calls of several adapters were measured faster
    assert single.hours["train"] > batched.hours["train"] and single.hours["eval"] > batched.hours["eval"]
    assert "train A0B0 (together)" not in single.figures


def test_off_policy_cells_share_the_fewest_jobs_and_each_such_job_pays_the_engine_start():
    from eps_screen.plan.phase_sizes import known_dispatches
    from eps_screen.spec.design import group_jobs, regime_of

    shipped = _four_gpus()
    config = _execution(shipped, min_cells_per_job=1)
    ex = config.execution
    smoke, slab = known_dispatches(config)
    mixed = 0
    for cells in (smoke, slab):
        jobs = group_jobs(config, [c.id for c in cells], ex.cells_per_job, ex.max_parallel_cells)
        for job in jobs:
            off = [regime_of(config, Cell.parse(c)).off_policy for c in job]
            assert off == sorted(off, reverse=True), job  # a job's off-policy cells first
            mixed += len(set(off)) > 1
        # the dispatch's off-policy cells fill as few jobs as they can
        n_off = sum(regime_of(config, c).off_policy for c in cells)
        size = len(jobs[0])
        assert sum(any(regime_of(config, Cell.parse(c)).off_policy for c in job) for job in jobs) == -(-n_off // size)
    assert mixed <= 2
    # smoke: 4 D1 cells in 2 of its 4 jobs; slab: its 44 off-policy cells in 2 of 4 (the smoke's regimes are made);
    # the 4 multi-seed jobs all counted
    assert off_policy_engine_starts(config) == 2 + 2 + 4
    # jobs of at least 9 cells, as shipped: the smoke in 1 job, the multi-seed cells in 2
    assert off_policy_engine_starts(shipped) == 1 + 2 + 2
    # as shipped, 2 GPUs and 44 cells a job: the slab's 44 off-policy cells in 1 of its 2 jobs
    assert off_policy_engine_starts(load_config(CONFIGS / "qwen7b.yaml")) == 1 + 1 + 2
    est = estimate(config)
    # the off-policy engine's start as measured with its weights in 8 bits: warm with execution.engine_cache_dir
    # (qwen7b.yaml), else cold; in bf16 likewise
    assert est.figures["off-policy engine start"]["value"] == 56
    cold = config.model_copy(update={"execution": config.execution.model_copy(update={"engine_cache_dir": None})})
    assert estimate(cold).figures["off-policy engine start"]["value"] == 264
    bf16 = config.with_sets({"off_policy.vllm_quantization": "none"})
    assert estimate(bf16).figures["off-policy engine start"]["value"] == 41
    assert estimate(bf16.with_sets({"execution.engine_cache_dir": None})).figures["off-policy engine start"]["value"] == 215
    assert any(n.startswith("engine starts counted warm") for n in est.notes)
    jsonl = config.model_copy(update={"off_policy": config.off_policy.model_copy(update={"kind": "jsonl", "path": "a.jsonl"})})
    assert off_policy_engine_starts(jsonl) == 0 and "off-policy engine start" not in estimate(jsonl).figures


def _qwen_eval(**eval_):
    config = load_config(CONFIGS / "qwen7b.yaml")
    return config.model_copy(update={"eval": config.eval.model_copy(update=eval_),
                                     "backend": config.backend.model_copy(update={"generation": "transformers"})})


def test_generation_rows_follow_the_prompt_token_cap_and_an_oom_batch_is_named():
    from eps_screen.plan.generation_rates import generate_rows

    shipped = _qwen_eval()
    assert generate_rows(shipped, 0) == 410 * 5  # short prompts: batch_size prompts x samples
    assert 200 <= generate_rows(shipped, 1) <= 270_000 // 1000  # long prompts: the cap decides
    assert not any("ran out of memory" in n for n in estimate(shipped).notes)
    # 256 prompts x 5 samples with no cap: 1280 sequences of 1045-token prompts per call, which did not fit the H200
    uncapped = _qwen_eval(batch_size=256, batch_prompt_tokens=None)
    assert generate_rows(uncapped, 1) == 1280
    note = [n for n in estimate(uncapped).notes if "ran out of memory" in n]
    assert note and "A1" in note[0] and "eval.batch_prompt_tokens" in note[0]
    # bigger calls of short prompts were measured faster: the capped config's evaluation is shorter
    small = _qwen_eval(batch_size=50, batch_prompt_tokens=None)
    assert estimate(shipped).hours["eval"] < estimate(small).hours["eval"]


def _execution(config, **values):
    return config.model_copy(update={"execution": config.execution.model_copy(update=values)})


def _four_gpus():
    """qwen7b.yaml on 4 GPUs at once with the fewest jobs for them (22 cells a job): every GPU busy in the slab."""
    return _execution(load_config(CONFIGS / "qwen7b.yaml"), max_parallel_cells=4, cells_per_job=22)


def test_cells_per_job_with_the_fewest_jobs_for_the_gpus():

    config = load_config(CONFIGS / "qwen7b.yaml")
    for gpus, best in ((8, 11), (4, 22), (2, 44)):  # the 88 slab cells of one dispatch decide
        at = _execution(config, max_parallel_cells=gpus)
        assert fewest_jobs_cells_per_job(at, 18) == best
        fewest = gpu_jobs(at, 18, best)
        # more cells per job changes nothing (dispatch keeps every GPU busy); fewer means more start-ups
        assert gpu_jobs(at, 18, best * 2) == fewest < gpu_jobs(at, 18, best - 1)
    small = _execution(config, max_parallel_cells=8, cells_per_job=2)
    assert any("execution.cells_per_job: 11 gives the fewest jobs" in n for n in estimate(small).notes)
    assert estimate(_execution(small, cells_per_job=11)).hours["startup"] < estimate(small).hours["startup"]


def test_a_warm_engine_cache_and_merged_adapters_shorten_the_screen():
    config = load_config(CONFIGS / "qwen7b.yaml")
    cold = _execution(config, engine_cache_dir=None)
    assert estimate(cold).hours["startup"] > estimate(config).hours["startup"]
    assert estimate(cold).figures["vLLM engine start"]["value"] > estimate(config).figures["vLLM engine start"]["value"]
    merged = config.model_copy(update={"eval": config.eval.model_copy(update={"vllm_merge_adapter": True})})
    assert estimate(merged).hours["eval"] < estimate(config).hours["eval"]
    assert estimate(merged).hours["regimes"] == estimate(config).hours["regimes"]  # answer sets have no adapter


def _unmeasured(est) -> list[str]:
    """Notes of figures not measured, apart from the vocabulary the generation figures were measured at (named in
    its own note while some figures are the tiny tokenizer's: test_the_generation_figures_vocabulary_is_named)."""
    return [n for n in est.notes if "not measured" in n and "2,048-token vocabulary" not in n]


def test_the_generation_figures_vocabulary_is_named():
    """Every vLLM figure of qwen7b.yaml's estimate was measured at Qwen2.5's vocabulary; the one file measured at the
    tiny tokenizer's (an 8-bit KV cache beside bf16 weights, A1B1) is named in a note where a config uses it."""
    from eps_screen.plan.generation_rates import tiny_vocab_files

    config = load_config(CONFIGS / "qwen7b.yaml")
    assert not [n for n in estimate(config).notes if "2,048-token vocabulary" in n]
    full = ("eval", "answers", "off-policy", "off-policy fp8 weights", "off-policy fp8 weights+kv")
    assert tiny_vocab_files(full) == []
    assert tiny_vocab_files(("off-policy fp8 kv",)) == ["gpu_full_size_off_policy_fp8_h200.json"]
    kv8 = config.with_sets({"off_policy.vllm_quantization": "none", "off_policy.vllm_kv_cache_dtype": "fp8"})
    (note,) = [n for n in estimate(kv8).notes if "2,048-token vocabulary" in n]
    assert "gpu_full_size_off_policy_fp8_h200.json" in note


def test_qwen7b_from_measured_figures_fits_ten_h200_hours():
    config = load_config(CONFIGS / "qwen7b.yaml")
    jsonl = config.model_copy(update={"off_policy": config.off_policy.model_copy(update={"kind": "jsonl", "path": "a.jsonl"})})
    est = estimate(jsonl)  # with off-policy answers from a file every throughput figure is a measured one
    assert est.gpu_hours <= 10, est.summary
    assert not _unmeasured(est)
    # What the 32B model's engine needs that no measurement had (it made random weights) is named, not hidden.
    fetch = "not counted: fetching the off-policy model's ~6"
    assert not any(n.startswith(fetch) for n in est.notes)
    assert any(n.startswith(fetch) and "each of those 4 jobs" in n for n in estimate(config).notes)


def test_gpu_types_without_a_measurement_are_named():
    config = load_config(CONFIGS / "qwen7b.yaml")
    assert not any("only the H200 was measured" in n for n in estimate(config).notes)  # qwen7b allows the H200 only
    wider = _execution(config, gpu_types=["NVIDIA H200", "NVIDIA A100-SXM4-80GB"])
    note = [n for n in estimate(wider).notes if "only the H200 was measured" in n]
    assert note and "NVIDIA A100-SXM4-80GB" in note[0] and "execution.gpu_hourly_usd" in note[0]


def test_a0b0_cells_trained_together_count_the_measured_figure_from_its_result_file():
    import json

    TOGETHER_RESULT = entry("train-together/A0B0/8")["result"]
    together = estimate(_qwen())
    fig = together.figures["train A0B0 (together)"]
    runs = json.loads((ROOT / fig["source"]).read_text())["runs"]
    measured = next(r for r in runs if r["condition"] == "A0B0" and r["mode"] == "together")
    assert fig["source"].endswith(TOGETHER_RESULT) and fig["value"] == round(measured["tokens_per_s"])
    # padded batches cannot share passes: the alone figure, and more training hours
    alone = estimate(_qwen(packing=False))
    assert "train A0B0 (together)" not in alone.figures
    assert together.hours["train"] < estimate(_qwen(gradient_checkpointing=True)).hours["train"]
    # the other conditions fill a pass with one cell: their figures stay the alone ones
    assert together.figures["train A0B1 (padfree+fused+compile)"]["source"].startswith(
        "benchmarks/results/gpu_train_h200_compile.json")
    assert TOGETHER_RESULT not in together.figures["train A0B1 (padfree+fused+compile)"]["source"]


def _marker_three(config):
    """The config with a 2^3 of three of the marker screen's treatments (A, B, E) in place of its design."""
    from eps_screen.spec.config import marker_factors, parse_config

    factors = [f.model_dump(mode="json") for f in marker_factors() if f.short in "ABE"]
    return parse_config({**config.model_dump(mode="json"), "design": {"factors": factors}})


def _fold_over(config):
    from eps_screen.spec.config import parse_config

    data = config.model_dump(mode="json")
    return parse_config({**data, "design": {**data["design"], "fold_over": True}})


def _dispatched_jobs(config) -> tuple[int, int]:
    """(GPU jobs, cells) as flows/screen.py dispatches them: the pre-screen, the smoke, the fold-over, every
    source's slab (one dispatch) less the cells already run, the multi-seed cells; each dispatch grouped by
    design.group_jobs."""
    from eps_screen.spec import design

    ex = config.execution
    runs = design.phases(config).slab.runs()
    top = {s: runs[: config.seeds.top_k] for s in config.sources}
    phases = [design.smoke_cells(config), design.fold_over_cells(config),
              design.all_slab_cells(config), design.multiseed_cells(config, top)]
    ran: set[str] = set()
    jobs = 1
    for cells in phases:
        todo = [c.id for c in cells if c.id not in ran]
        jobs += len(design.group_jobs(config, todo, ex.cells_per_job, ex.max_parallel_cells)) if todo else 0
        ran.update(todo)
    return jobs, len(ran)


@pytest.mark.parametrize("name", ["tiny-recipe", "sim-6-2", "2^3", "2^(5-2) with fold-over", "qwen7b"])
def test_jobs_and_cells_counted_are_those_of_the_declared_design(name):
    from eps_screen.plan.phase_sizes import dispatch_groups
    from eps_screen.plan.screen_plan import make_plan

    config = {"2^3": lambda: _marker_three(_qwen()), "2^(5-2) with fold-over": lambda: _fold_over(_qwen())}.get(
        name, lambda: load_config(CONFIGS / f"{name}.yaml"))()
    plan = make_plan(config)
    slab = {"tiny-recipe": 16, "sim-6-2": 16, "2^3": 8, "2^(5-2) with fold-over": 32, "qwen7b": 32}[name]
    assert plan.cells_per_phase["slab"] == slab * len(config.sources)
    for gpus, per_job in ((8, 4), (4, 8), (2, 16), (3, 5)):
        at = _execution(config, max_parallel_cells=gpus, cells_per_job=per_job)
        jobs, cells = _dispatched_jobs(at)
        assert gpu_jobs(at) == jobs and sum(dispatch_groups(at)) == cells == plan.distinct_cells
        assert estimate(at).work["cells"] == plan.distinct_cells
        best = fewest_jobs_cells_per_job(at)
        assert gpu_jobs(at, cells_per_job=best) == _dispatched_jobs(_execution(at, cells_per_job=best))[0]
        assert gpu_jobs(at, cells_per_job=best) < gpu_jobs(at, cells_per_job=best - 1) if best > 1 else True


def test_the_cost_of_a_smaller_design_is_its_own():
    full, three = _qwen(), _marker_three(_qwen())
    big, small = estimate(full), estimate(three)
    startup = _start_up_per_job(full, big)
    assert startup > figure("assumed/pod-startup").value and _start_up_per_job(three, small) == pytest.approx(startup)
    assert any(f"; {gpu_jobs(three)} jobs of up to" in n for n in small.notes)
    # 8 slab cells per source against 32, the same mix of A x B conditions and loss masks: a quarter of the work
    assert small.work["cells"] == 3 * 8 + 3 * 3 * 2 and big.work["cells"] == 114
    assert small.work["training_tokens"] / small.work["cells"] == pytest.approx(big.work["training_tokens"] / 114)
    assert small.cost_usd < big.cost_usd / 2


def test_a_factor_that_sets_the_epochs_counts_its_cells_training():
    from eps_screen.spec.config import parse_config

    config = _marker_three(_qwen())
    data = config.model_dump(mode="json")
    factors = [*data["design"]["factors"], {"short": "N", "label": "Epochs", "levels": [
        {"description": "1", "sets": {"training.epochs": 1}}, {"description": "3", "sets": {"training.epochs": 3}}]}]
    with_epochs = parse_config({**data, "design": {"factors": factors}, "training": {**data["training"], "epochs": 1}})
    one = estimate(parse_config({**data, "training": {**data["training"], "epochs": 1}}))
    # half the cells train 1 epoch, half 3: twice the single-epoch tokens per cell
    mixed = estimate(with_epochs)
    assert mixed.work["training_tokens"] / mixed.work["cells"] == pytest.approx(
        2 * one.work["training_tokens"] / one.work["cells"])
    assert mixed.hours["train"] > one.hours["train"]


def test_generation_figures_are_the_full_size_measurements_of_each_condition():
    import json

    config = load_config(CONFIGS / "qwen7b.yaml")
    est = estimate(config)
    # each cell evaluated in an engine call of its own (a job's calls of several adapters: the next test)
    alone = estimate(_qwen_execution(job_eval="per_cell"))
    for c in CONDITIONS:
        for name, kind, run in ((f"generate {c} (vLLM, lora adapter)", "eval", f"{c}:eval"),
                                (f"answers {c} (vLLM, no adapter)", "answers", f"{c}:answers"),
                                (f"off-policy answers {c} (vLLM, the 32B shape, fp8 weights)", "off-policy fp8 weights",
                                 f"{c}:answers")):
            fig = (alone if kind == "eval" else est).figures[name]
            assert fig["source"] == full_size(kind, c).source, name
            measured = json.loads((ROOT / fig["source"]).read_text())["runs"][run]
            assert fig["value"] == round(measured["tokens_per_s"]), name
    # with the off-policy model measured, every throughput figure of the shipped config is a measured one
    assert not _unmeasured(est), est.notes
    # another off-policy model: the measured 32B figures scaled by its size
    bigger = config.model_copy(update={"off_policy": config.off_policy.model_copy(update={"model": "Qwen/Qwen2.5-72B-Instruct"})})
    big = estimate(bigger)
    assert any("32B-shaped model's measured figures scaled x2.2" in n for n in big.notes), big.notes
    assert big.hours["regimes"] > est.hours["regimes"] and big.hours["eval"] == est.hours["eval"]


def test_the_training_figure_is_the_one_measured_with_the_configs_micro_batches():
    name = "train A1B1 (padfree+fused+compile)"
    split, whole = estimate(_qwen(share_prefix=False)), estimate(_qwen(share_prefix=False, max_batch_tokens=None))
    # qwen7b.yaml cuts A1B1's 8 x 2,093 tokens at 11,000: 2 micro-batches of 4, measured so
    runs = json.loads((ROOT / RESULTS / "gpu_train_h200_compile3.json").read_text())["runs"]
    (run,) = [r for r in runs if (r["condition"], r["micro_batch"], r["grad_accum"]) == ("A1B1", 4, 2)]
    assert run["options"]["max_batch_tokens"] == 11000
    assert split.figures[name]["value"] == round(run["steady_tokens_per_s"]) == 15382
    assert split.figures[name]["source"].endswith("gpu_train_h200_compile3.json")
    # the other conditions' batches fit whole: their figures are the whole-batch ones
    assert split.figures["train A0B1 (padfree+fused+compile)"] == whole.figures["train A0B1 (padfree+fused+compile)"]
    # no max_batch_tokens: the whole batch in one pass, measured faster
    assert whole.figures[name]["value"] == 16060 and whole.figures[name]["source"].endswith("compile2.json")
    assert whole.hours["train"] < split.hours["train"]
    # without compile, the same split measured under that profile
    assert estimate(_qwen(compile=False, share_prefix=False)).figures["train A1B1 (padfree+liger+fused)"]["value"] == 15360
    # a split never measured: the whole-batch figure, said so
    small = estimate(_qwen(max_batch_tokens=5000, share_prefix=False))
    assert small.figures[name] == whole.figures[name]
    assert any(n.startswith("train A1B1: 4 micro-batches of 2 a step") and "not measured" in n for n in small.notes)
    assert not any("micro-batches" in n for n in split.notes + whole.notes)


def _per_job_start_up() -> float:
    per_job = sum(figure(k).value for k in ("assumed/pod-startup", "start/vllm-warm", "start/first-sleep",
                                            "start/compile-warmup"))
    assert per_job == 257  # 180 + 47 + 5 + 25: the figures qwen7b.yaml's jobs pay
    return per_job


def test_the_pre_screen_job_pays_no_training_warm_up():
    warmup, sleep = figure("start/compile-warmup").value, figure("start/first-sleep").value
    config = _qwen()
    est, jobs = estimate(config), gpu_jobs(config)
    per_job = _per_job_start_up()
    off = off_policy_engine_starts(config) * _off_policy_job_s(config)
    # the pre-screen's job trains nothing: no compile warm-up, and its engine never sleeps for training
    pre_screen = per_job - warmup - sleep
    assert est.hours["startup"] * 3600 == pytest.approx(pre_screen + (jobs - 1) * per_job + off)
    assert est.job_hours[0] == [pytest.approx(est.hours["pre_screen"] + pre_screen / 3600)]
    # compile costs its warm-up in every cell job, not in the pre-screen's
    eager = estimate(_qwen(compile=False))
    assert (est.hours["startup"] - eager.hours["startup"]) * 3600 == pytest.approx((jobs - 1) * warmup)
    assert any("the pre-screen's 227 s" in n for n in est.notes)


def test_on_the_local_gpu_pool_a_gpus_later_jobs_start_in_its_job_host():
    config = load_config(CONFIGS / "smol-marker.yaml")  # one GPU at once
    est = estimate(config)
    first, later = figure("start/local-gpu-job").value, figure("start/local-gpu-job-later").value
    assert first > later  # the first converts the packaged weights; a later one finds them converted

    def off(c):
        return off_policy_engine_starts(c) * (est.figures["off-policy engine start"]["value"]
                                              + figure("start/off-policy-process").value + figure("start/base-aside").value)

    engine = est.figures["vLLM engine start"]["value"]
    # the pre-screen's job trains nothing: its GPU's first job that trains sleeps the engines and compiles, once
    once = est.figures["first engine sleep"]["value"] + est.figures["compile warm-up"]["value"]
    pre_screen = first + engine
    # every later job finds the host's engines and trainers up: it starts only the off-policy engine
    assert est.hours["startup"] * 3600 == pytest.approx(pre_screen + once + off(config))
    assert est.job_hours[0] == [pytest.approx(est.hours["pre_screen"] + (pre_screen + once) / 3600)]
    # a second GPU's first job starts its own host, as a job in a process of its own does
    two = config.with_sets({"execution.max_parallel_cells": 2})
    assert gpu_jobs(two) > 2
    per_job = later + engine + once
    assert estimate(two).hours["startup"] * 3600 == pytest.approx(pre_screen + once + per_job + off(two))


def test_more_gpus_at_once_shorten_the_wall_clock_and_cost_more_start_ups():
    from eps_screen.plan.cost_estimate import at_gpu_counts

    config = _qwen()
    by_gpus = at_gpu_counts(config)
    walls = [e.wall_hours for e in by_gpus.values()]
    gpu_hours = [e.gpu_hours for e in by_gpus.values()]
    assert list(by_gpus) == [1, 2, 4, 8]
    assert walls == sorted(walls, reverse=True) and len(set(walls)) == 4
    assert gpu_hours == sorted(gpu_hours) and len(set(gpu_hours)) == 4
    # one GPU runs every job in turn: the wall clock is the GPU-hours
    assert by_gpus[1].wall_hours == pytest.approx(by_gpus[1].gpu_hours)
    # the shipped config (2 GPUs, 44 cells a job) is the 2-GPU row
    shipped = estimate(config)
    assert shipped.gpus_at_once == 2 and shipped.wall_hours == pytest.approx(by_gpus[2].wall_hours)
    assert shipped.gpu_hours == pytest.approx(by_gpus[2].gpu_hours)
    assert shipped.as_dict()["wall_hours"] == shipped.wall_hours
    assert any(line.startswith(f"wall clock: {shipped.wall_hours:.1f} h with 2 GPUs at once") for line in shipped.lines())
    assert estimate(load_config(CONFIGS / "tiny.yaml")).wall_hours is None  # in-process on the CPU


def test_each_dispatchs_job_times_add_up_to_its_share_of_the_gpu_hours():
    from eps_screen.plan.phase_sizes import dispatch_groups

    config = _four_gpus()
    est = estimate(config)
    assert [len(jobs) for jobs in est.job_hours] == [1, 1, 4, 2]  # the pre-screen, smoke, slab, multi-seed jobs
    assert sum(map(len, est.job_hours)) == gpu_jobs(config)
    # the multi-seed jobs: start-up (the off-policy engine's in each), and 18 mean cells with an answer set each
    n_multi, cells = dispatch_groups(config)[-1], est.work["cells"]
    per_job = _per_job_start_up() + _off_policy_job_s(config)
    regimes = 48  # the phase-1-2 answer sets: 18 more in phase 3 as their mean
    share = (len(est.job_hours[-1]) * per_job / 3600 + (est.hours["train"] + est.hours["eval"]) * n_multi / cells
             + est.hours["regimes"] * n_multi / (regimes + n_multi))
    assert sum(est.job_hours[-1]) == pytest.approx(share)
    # as shipped no two jobs of a dispatch share an answer set (each job holds whole regimes): the jobs add up to
    # the GPU-hours, the pre-screen's job with them
    assert sum(map(sum, est.job_hours)) == pytest.approx(est.gpu_hours)
    # one GPU, one cell per job: each answer set is made once, by the first job that needs it; later jobs read it
    # from the store (and start no off-policy engine for it, which the GPU-hours count in every such job)
    serial = estimate(_execution(config, max_parallel_cells=1, cells_per_job=1))
    assert serial.wall_hours == pytest.approx(sum(map(sum, serial.job_hours)))
    assert serial.wall_hours <= serial.gpu_hours
    assert serial.gpu_hours - serial.wall_hours < est.hours["regimes"]
    # 8 such jobs at once: those that start together and share an answer set each make it
    parallel = estimate(_execution(config, max_parallel_cells=8, cells_per_job=1))
    assert sum(map(sum, parallel.job_hours)) > sum(map(sum, serial.job_hours))


def test_validate_prints_the_wall_clock_and_what_other_gpu_counts_give(capsys):
    from types import SimpleNamespace

    from flows.cli import validate

    assert validate.run(SimpleNamespace(config=str(CONFIGS / "qwen7b.yaml"))) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    at = next(i for i, line in enumerate(lines) if line.startswith("estimate: "))
    assert lines[at + 1].startswith(f"wall clock: {estimate(_qwen()).wall_hours:.1f} h with 2 GPUs at once")
    counts = lines[at + 2]
    assert counts.startswith("GPUs at once: 1 -> ") and all(f", {n} -> " in counts for n in (2, 4, 8))
    assert " h GPU / " in counts and "fewest jobs" in counts
    assert validate.run(SimpleNamespace(config=str(CONFIGS / "tiny.yaml"))) == 0  # on the CPU: neither line
    assert not any(s in capsys.readouterr().out for s in ("wall clock:", "GPUs at once:"))


def _without_figures(monkeypatch, prefix: str, *configs):
    """The estimates of configs as if figures.json had no entries under `prefix`."""
    from eps_screen.plan import figures

    kept = {k: e for k, e in figures.entries().items() if not k.startswith(prefix)}
    with monkeypatch.context() as m:
        m.setattr(figures, "entries", lambda: kept)
        return [estimate(c) for c in configs]


def test_shared_prefixes_speed_up_the_a1_figures_by_their_measured_ratio(monkeypatch):

    # measured on top of shared prefixes, the step-sync speed-up is left out of this comparison
    shared, plain = _without_figures(monkeypatch, "step-syncs/", _qwen(), _qwen(share_prefix=False))
    for condition, micro in (("A1B0", 8), ("A1B1", 4)):  # measured at qwen7b.yaml's split (A1B1 in 2 micro-batches of 4)
        name = f"train {condition} (padfree+fused+compile)"
        measured = entry(f"shared-prefix/{condition}/{micro}")
        ratio = measured["value"]
        assert shared.figures[name]["value"] == round(plain.figures[name]["value"] * ratio)
        assert shared.figures[name]["source"].endswith(measured["result"]) and 1.05 < ratio < 1.3
    for name in ("train A0B1 (padfree+fused+compile)", "train A0B0 (together)"):  # short system prompts: no sharing
        assert shared.figures[name] == plain.figures[name]
    assert shared.hours["train"] < plain.hours["train"]
    # A1B1 in micro-batches of 2 was never measured with shared prefixes: counted as none, said so
    small = estimate(_qwen(max_batch_tokens=5000))
    assert any(n.startswith("train A1B1: shared prefixes not measured with micro-batches of 2") for n in small.notes)


def test_training_without_per_step_syncs_speeds_up_each_measured_condition_by_its_ratio(monkeypatch):

    shipped = estimate(_qwen())
    before, = _without_figures(monkeypatch, "step-syncs/", _qwen())
    for condition, micro in (("A1B0", 8), ("A0B1", 8), ("A1B1", 4)):  # each at qwen7b.yaml's split, shared prefixes on
        name = f"train {condition} (padfree+fused+compile)"
        measured = entry(f"step-syncs/{condition}/{micro}")
        ratio = measured["value"]
        assert shipped.figures[name]["value"] == round(before.figures[name]["value"] * ratio)
        assert shipped.figures[name]["source"].endswith(measured["result"]) and 1.02 < ratio < 1.2
        assert any(n.startswith(f"train {condition}: the step without per-step syncs not measured") for n in before.notes)
    assert shipped.figures["train A0B0 (together)"] == before.figures["train A0B0 (together)"]  # its own loop
    assert shipped.hours["train"] < before.hours["train"]
    # measured with micro-batches of 4 for A1B1: another split is counted as before, and said so
    small = estimate(_qwen(max_batch_tokens=5000))
    assert any(n.startswith("train A1B1: the step without per-step syncs not measured with micro-batches of 2")
               for n in small.notes)


def test_a_least_job_size_trades_start_ups_for_wall_clock_in_the_small_phases():
    from eps_screen.plan.phase_sizes import known_dispatches
    from eps_screen.spec.design import group_jobs

    shipped = _four_gpus()
    assert shipped.execution.min_cells_per_job == 9
    every_gpu = _execution(shipped, min_cells_per_job=1)
    smoke, slab = known_dispatches(shipped)
    for config, sizes in ((shipped, ([8], [22] * 4)), (every_gpu, ([2] * 4, [22] * 4))):
        ex = config.execution
        got = [[len(j) for j in group_jobs(config, [c.id for c in cells], ex.cells_per_job, ex.max_parallel_cells)]
               for cells in (smoke, slab)]
        assert tuple(got) == sizes
    assert gpu_jobs(shipped) == 1 + 1 + 4 + 2 and gpu_jobs(every_gpu) == 1 + 4 + 4 + 4
    fewer, more = estimate(shipped), estimate(every_gpu)
    assert fewer.gpu_hours < more.gpu_hours and fewer.wall_hours > more.wall_hours
    assert fewer.hours["train"] == more.hours["train"], "the same cells, trained the same way"


def test_each_off_policy_engine_setting_uses_its_measured_figures_and_names_where_it_falls_back():
    config = _qwen()
    rates = {}
    for (kv, weights), kind in OFF_POLICY_KINDS.items():
        est = estimate(config.with_sets({"off_policy.vllm_kv_cache_dtype": kv, "off_policy.vllm_quantization": weights}))
        figures = {name.split()[2]: f for name, f in est.figures.items() if name.startswith("off-policy answers")}
        assert set(figures) == set(CONDITIONS)
        for c in CONDITIONS:
            measured = full_size(kind, c)
            fell_back = [n for n in est.notes if n.startswith(f"off-policy answers {c}: ")]
            if measured:  # measured under these settings: that figure, nothing to say
                assert figures[c]["value"] == measured.value and not fell_back, (kind, c)
                assert figures[c]["source"] == measured.source
            else:  # the nearest measured settings (the KV cache's in bf16), slower, said so
                (note,) = fell_back
                assert note.startswith(f"off-policy answers {c}: an fp8 KV cache not measured there"), note
                assert "(slower)" in note
        rates[kv, weights] = {c: figures[c]["value"] for c in CONDITIONS}
        assert not any("vllm_quantization" in n and "not measured" in n for n in est.notes)
    # 8-bit weights and an 8-bit KV cache each make the long answer sets faster, both together the fastest
    for c in ("A0B1", "A1B1"):
        assert rates["auto", "none"][c] < rates["auto", "fp8"][c] < rates["fp8", "fp8"][c]
        assert rates["auto", "none"][c] <= rates["fp8", "none"][c]
    assert all(rates["auto", "none"][c] < rates["auto", "fp8"][c] for c in CONDITIONS)


def _qwen_execution(**execution):
    config = load_config(CONFIGS / "qwen7b.yaml")
    return config.model_copy(update={"execution": config.execution.model_copy(update=execution)})


def test_a_jobs_evaluation_calls_are_its_stages_as_the_job_splits_them():
    from eps_screen.plan.generation_rates import stage_shares
    from eps_screen.train.stages import stage_split

    # a group that shares passes splits into near-equal parts of at most 8, the other cells 8 at a time in order
    assert stage_split([[0, 2, 4, 6, 8, 10, 12, 14, 16]], 18, 8) == [
        ([0, 2, 4, 6], True), ([8, 10, 12, 14, 16], True), ([1, 3, 5, 7, 9, 11, 13, 15], False), ([17], False)]
    config = _qwen_execution()
    assert config.execution.cells_per_stage == 8
    assert stage_shares(config, 1) == dict.fromkeys(("A0B0", "A1B0", "A0B1", "A1B1"), 1.0)
    assert set(stage_shares(config, 2).values()) == {1.0}  # no job of qwen7b.yaml leaves a cell alone in a stage
    nine = stage_shares(config, 9)  # no stage holds more than cells_per_stage
    assert set(nine.values()) == {0.0}
    three, eight = stage_shares(config, 3), stage_shares(config, 8)
    assert all(eight[c] <= three[c] for c in three) and 0 < eight["A1B1"] < 1
    assert set(stage_shares(_qwen_execution(cells_per_stage=1), 2).values()) == {0.0}
    assert stage_shares(_qwen_execution(job_eval="per_cell"), 1) == {}  # each cell its own call


def test_a_conditions_stage_of_adapters_in_one_call_counts_its_measured_speed_up_where_jobs_make_such_calls():
    from eps_screen.plan.figures import keyed
    from eps_screen.plan.generation_rates import stage_shares, stage_speedup

    shipped, alone = estimate(_qwen_execution()), estimate(_qwen_execution(job_eval="per_cell"))
    stages = keyed("eval-stage/")
    assert stages
    for key, measured in stages.items():
        condition = key.split("/")[0]
        n, speedup, source = stage_speedup(condition)
        assert key == f"{condition}/{n}" and speedup == measured["value"] and source.endswith(measured["result"])
        name = f"generate {condition} (vLLM, lora adapter)"
        one = alone.figures[name]
        assert one["source"] == full_size("eval", condition).source
        share = stage_shares(_qwen_execution(), n)[condition]
        assert share == 1.0  # every A1B1 cell of qwen7b.yaml is evaluated in a call of at least n adapters
        assert shipped.figures[name]["value"] == round(one["value"] * speedup)
        assert shipped.figures[name]["source"].endswith(measured["result"])
    # a condition whose stage was not measured keeps its one-cell figure
    assert shipped.figures["generate A0B1 (vLLM, lora adapter)"] == alone.figures["generate A0B1 (vLLM, lora adapter)"]
    assert shipped.hours["eval"] < alone.hours["eval"]


def test_off_policy_weights_in_8_bits_shorten_the_answer_sets_and_start_as_measured():
    shipped = _qwen()
    assert shipped.off_policy.vllm_quantization == "fp8"
    bf16 = shipped.with_sets({"off_policy.vllm_quantization": "none"})
    est, full = estimate(shipped), estimate(bf16)
    assert est.hours["regimes"] < full.hours["regimes"]
    assert all(est.hours[k] == full.hours[k] for k in ("train", "eval", "pre_screen"))
    # each job that starts the off-policy engine starts it with its weights in 8 bits: that start, measured warm
    longer = figure("start/off-policy-fp8-warm").value - figure("start/off-policy-warm").value
    assert est.hours["startup"] * 3600 == pytest.approx(full.hours["startup"] * 3600 + off_policy_engine_starts(shipped) * longer)
    assert est.figures["off-policy engine start"]["source"] == figure("start/off-policy-fp8-warm").source


def test_validate_prints_what_the_off_policy_answer_sets_other_ways_would_make_the_screen(capsys):
    from types import SimpleNamespace

    from eps_screen.plan.cost_estimate import off_policy_choices
    from flows.cli import validate

    config = _qwen()
    choices = off_policy_choices(config)
    bf16, fp8 = choices["off_policy.vllm_quantization: none"], choices["off_policy.vllm_kv_cache_dtype: fp8"]
    outside = choices["off_policy.kind: jsonl or a hosted API"]
    shipped = estimate(config)
    # bf16 weights make the 32B model's answer sets slower (its engine starts 15 s sooner), an 8-bit KV cache faster; a file or an API makes them
    # cost no GPU time, and no job starts that engine; training and evaluation are the same either way
    assert bf16.hours["regimes"] > shipped.hours["regimes"] and bf16.hours["startup"] < shipped.hours["startup"]
    assert fp8.hours["regimes"] < shipped.hours["regimes"] and fp8.hours["startup"] == shipped.hours["startup"]
    assert outside.hours["regimes"] < fp8.hours["regimes"] and outside.hours["startup"] < shipped.hours["startup"]
    assert all(e.hours["train"] == shipped.hours["train"] and e.hours["eval"] == shipped.hours["eval"]
               for e in choices.values())
    assert validate.run(SimpleNamespace(config=str(CONFIGS / "qwen7b.yaml"))) == 0
    (line,) = [s.strip() for s in capsys.readouterr().out.splitlines() if "other ways" in s]
    assert line == ("off-policy answers, other ways: "
                    f"off_policy.vllm_quantization: none -> {bf16.gpu_hours:.1f} h GPU (answer sets {bf16.hours['regimes']:.2f}), "
                    f"off_policy.vllm_kv_cache_dtype: fp8 -> {fp8.gpu_hours:.1f} h GPU (answer sets {fp8.hours['regimes']:.2f}),"
                    f" off_policy.kind: jsonl or a hosted API -> {outside.gpu_hours:.1f} h GPU (answer sets"
                    f" {outside.hours['regimes']:.2f})")
    # the KV cache already fp8: the weights' other precision and the outside way; bf16 weights offer 8-bit ones;
    # answers from outside already, or the tiny model on the CPU: no line
    kv8 = config.with_sets({"off_policy.vllm_kv_cache_dtype": "fp8"})
    assert list(off_policy_choices(kv8)) == ["off_policy.vllm_quantization: none", "off_policy.kind: jsonl or a hosted API"]
    back = off_policy_choices(config.with_sets({"off_policy.vllm_quantization": "none"}))
    assert list(back)[0] == "off_policy.vllm_quantization: fp8"
    assert back["off_policy.vllm_quantization: fp8"].gpu_hours == pytest.approx(shipped.gpu_hours)
    jsonl = config.model_copy(update={"off_policy": config.off_policy.model_copy(update={"kind": "jsonl", "path": "a.jsonl"})})
    assert off_policy_choices(jsonl) == {} and off_policy_choices(load_config(CONFIGS / "tiny.yaml")) == {}


def test_a_tiny_off_policy_model_is_priced_as_the_base_models_answers_not_the_32b():
    """smol-marker.yaml's off-policy answers come from tiny-alt: its answer sets at the base model's answer speed
    and its engine started as the base model's, never at the 32B-shaped off-policy figures."""
    config = load_config(CONFIGS / "smol-marker.yaml")
    est = estimate(config)
    assert not [k for k in est.figures if k.startswith("off-policy answers")]
    assert est.figures["off-policy engine start"] == est.figures["vLLM engine start"]
    assert any("tiny-alt (a tiny model eps-screen builds)" in n for n in est.notes)
    assert not any("fetching the off-policy model" in n for n in est.notes)
    on_file = estimate(config.with_sets({"off_policy.kind": "jsonl", "off_policy.path": str(ROOT / "README.md")}))
    # answer sets: the off-policy half costs what the on-policy half does, at most
    assert est.hours["regimes"] <= 2.05 * on_file.hours["regimes"]
