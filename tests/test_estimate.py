"""The GPU-hours estimate: computed from measured figures that name their result files."""

from __future__ import annotations

import pytest

from eps_screen.config import load_config
from eps_screen.estimate import estimate
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


def test_start_up_counts_the_jobs_dispatch_will_form():
    from eps_screen.design import group_jobs
    from eps_screen.estimate import gpu_jobs

    config = load_config(CONFIGS / "qwen7b.yaml")
    config = config.model_copy(update={"execution": config.execution.model_copy(update={"cells_per_job": 4, "max_parallel_cells": 8})})
    # the same grouping as dispatch: pre-screen 1, smoke 8 cells -> 8 jobs (8 GPUs), the smoke source's
    # 24 remaining slab cells -> 8 jobs of 3, two full slabs -> 8 jobs of 4 each, 18 multi-seed cells -> 6 jobs
    def jobs(n: int) -> int:
        return len(group_jobs(config, [f"s{i:02d}-A0B0C0D0E0-s1" for i in range(n)], 4, 8))

    assert gpu_jobs(config, 8, 18) == 1 + jobs(8) + jobs(24) + 2 * jobs(32) + jobs(18) == 39
    one_per_job = config.model_copy(update={"execution": config.execution.model_copy(update={"cells_per_job": 1})})
    batched, single = estimate(config), estimate(one_per_job)
    assert single.hours["startup"] / batched.hours["startup"] == pytest.approx(115 / 39)
    # one cell per job trains alone: only the A0B0 cells, which share passes in bigger jobs, take longer
    assert single.hours["train"] > batched.hours["train"] and single.hours["eval"] == batched.hours["eval"]
    assert "train A0B0 (together)" not in single.figures


def _qwen_eval(**eval_):
    config = load_config(CONFIGS / "qwen7b.yaml")
    return config.model_copy(update={"eval": config.eval.model_copy(update=eval_),
                                     "backend": config.backend.model_copy(update={"generation": "transformers"})})


def test_generation_rows_follow_the_prompt_token_cap_and_an_oom_batch_is_named():
    from eps_screen.estimate import generate_rows

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


def test_cells_per_job_with_the_fewest_jobs_for_the_gpus():
    from eps_screen.estimate import fewest_jobs_cells_per_job, gpu_jobs

    config = load_config(CONFIGS / "qwen7b.yaml")
    for gpus, best in ((8, 4), (4, 8), (2, 16)):
        at = _execution(config, max_parallel_cells=gpus)
        assert fewest_jobs_cells_per_job(at, 8, 18) == best
        fewest = gpu_jobs(at, 8, 18, best)
        # more cells per job changes nothing (dispatch keeps every GPU busy); fewer means more start-ups
        assert gpu_jobs(at, 8, 18, best * 2) == fewest < gpu_jobs(at, 8, 18, best - 1)
    small = _execution(config, max_parallel_cells=8, cells_per_job=2)
    assert any("execution.cells_per_job: 4 gives the fewest jobs" in n for n in estimate(small).notes)
    assert estimate(_execution(small, cells_per_job=4)).hours["startup"] < estimate(small).hours["startup"]


def test_a_warm_engine_cache_and_merged_adapters_shorten_the_screen():
    config = load_config(CONFIGS / "qwen7b.yaml")
    cold = _execution(config, engine_cache_dir=None)
    assert estimate(cold).hours["startup"] > estimate(config).hours["startup"]
    assert estimate(cold).figures["vLLM engine start"]["value"] > estimate(config).figures["vLLM engine start"]["value"]
    merged = config.model_copy(update={"eval": config.eval.model_copy(update={"vllm_merge_adapter": True})})
    assert estimate(merged).hours["eval"] < estimate(config).hours["eval"]
    assert estimate(merged).hours["regimes"] == estimate(config).hours["regimes"]  # answer sets have no adapter


def test_qwen7b_from_measured_figures_fits_ten_h200_hours():
    config = load_config(CONFIGS / "qwen7b.yaml")
    jsonl = config.model_copy(update={"off_policy": config.off_policy.model_copy(update={"kind": "jsonl", "path": "a.jsonl"})})
    est = estimate(jsonl)  # with off-policy answers from a file every throughput figure is a measured one
    assert est.gpu_hours <= 10, est.summary
    assert not any("not measured" in n for n in est.notes)


def test_gpu_types_without_a_measurement_are_named():
    config = load_config(CONFIGS / "qwen7b.yaml")
    assert not any("only the H200 was measured" in n for n in estimate(config).notes)  # qwen7b allows the H200 only
    wider = _execution(config, gpu_types=["NVIDIA H200", "NVIDIA A100-SXM4-80GB"])
    note = [n for n in estimate(wider).notes if "only the H200 was measured" in n]
    assert note and "NVIDIA A100-SXM4-80GB" in note[0] and "execution.gpu_hourly_usd" in note[0]


def test_a0b0_cells_trained_together_count_the_measured_figure_from_its_result_file():
    import json

    from eps_screen.estimate import TOGETHER_RESULT

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
    assert together.figures["train A1B1 (padfree+fused+compile)"]["source"].endswith("compile2.json")
