"""The estimate of a model of another shape: the measured 7B figures carried over by FLOPs per token, a small model
held to the speed measured on SmolLM2-135M."""

from __future__ import annotations

import json

import pytest

from eps_screen.models.shape import KNOWN, MEASURED, model_shape
from eps_screen.plan.cost_estimate import estimate
from eps_screen.plan.phase_sizes import gpu_jobs
from eps_screen.plan.figures import figure
from eps_screen.spec.config import load_config
from tests.conftest import CONFIGS

SMOL = {"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152,
        "tie_word_embeddings": True}


def _with_model(tmp_path, shape: dict | str):
    base = shape
    if isinstance(shape, dict):
        (tmp_path / "config.json").write_text(json.dumps(shape))
        base = str(tmp_path)
    return load_config(CONFIGS / "qwen7b.yaml").with_sets({"model.base": base})


def test_a_local_small_llama_is_estimated_from_its_own_shape(tmp_path):
    small, seven = estimate(_with_model(tmp_path, SMOL)), estimate(load_config(CONFIGS / "qwen7b.yaml"))
    shape = model_shape(str(tmp_path))
    assert shape.params == pytest.approx(134.5e6, rel=0.01) and shape == KNOWN["smollm2-135m-instruct"]
    assert any("134M parameters (30 layers, hidden 576, vocabulary 49,152)" in n for n in small.notes)
    # fewer FLOPs per token: every part that runs the base model is quicker, none slower
    assert small.hours["train"] < seven.hours["train"] / 2
    for part in ("eval", "pre_screen"):
        assert small.hours[part] < seven.hours[part]
    # generation held to the speed measured on the small model, never below the 7B's
    lora, base = figure("anchor/smollm2-h100/vllm-lora").value, figure("anchor/smollm2-h100/vllm-base").value
    for c in ("A0B0", "A1B0", "A0B1", "A1B1"):
        gen = small.figures[f"generate {c} (vLLM, lora adapter)"]["value"]
        assert gen == max(lora, seven.figures[f"generate {c} (vLLM, lora adapter)"]["value"]), c
        assert small.figures[f"answers {c} (vLLM, no adapter)"]["value"] == max(
            base, seven.figures[f"answers {c} (vLLM, no adapter)"]["value"]), c
    # training: a long cell at the small model's step time, a short one no slower than the 7B's
    step_s = figure("anchor/smollm2-h100/train").value / (600 * 3 / 16)
    long = small.figures["train A0B1 (padfree+fused+compile)"]
    assert long["value"] < 8 * 1100 / step_s and "capped" in long["note"]
    assert small.figures["train A0B0 (together)"]["value"] >= seven.figures["train A0B0 (together)"]["value"]
    # the engine starts as the small model's did; its first sleep moves far fewer weights
    assert small.figures["vLLM engine start"]["value"] == figure("anchor/smollm2-h100/engine-warm").value
    assert small.figures["first engine sleep"]["value"] < 0.5
    # the same shape by name gives the same estimate
    named = estimate(_with_model(tmp_path, "smollm2-135m-instruct"))
    assert named.hours == small.hours


def test_a_larger_model_scales_down_by_its_flops_per_token(tmp_path):
    big = {**SMOL, "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8,
           "intermediate_size": 27648, "vocab_size": 152064, "tie_word_embeddings": False}
    del big["head_dim"]
    est, seven = estimate(_with_model(tmp_path, big)), estimate(load_config(CONFIGS / "qwen7b.yaml"))
    shape = model_shape(str(tmp_path))
    name = "train A1B1 (padfree+fused+compile)"
    ratio = seven.figures[name]["value"] / est.figures[name]["value"]
    assert 3.5 < ratio < 5 and ratio == pytest.approx(shape.flops_per_token(1000) / MEASURED.flops_per_token(1000), rel=0.1)
    assert est.hours["train"] > 3 * seven.hours["train"] and "capped" not in est.figures[name]["note"]
    assert est.figures["vLLM engine start"] == seven.figures["vLLM engine start"]


def test_the_measured_shape_is_the_7b_and_is_not_scaled():
    config = load_config(CONFIGS / "qwen7b.yaml")
    assert model_shape(config.model.base) == MEASURED
    assert not any("FLOPs per token" in n for n in estimate(config).notes)
    assert estimate(config).summary.startswith("7.0 H200-hours")


def test_a_gguf_file_once_converted_is_estimated_from_its_converted_config(tmp_path, monkeypatch):
    from eps_screen.models import packaged as packaged_models

    monkeypatch.setenv("EPS_SCREEN_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "small.gguf"
    gguf.write_bytes(b"GGUF stand-in: only its hash names the converted directory")
    assert model_shape(str(gguf)) is None  # not converted yet: its shape is not known before the first run
    converted = packaged_models._converted_dir(str(gguf), packaged_models.sha256_of(gguf))
    converted.mkdir(parents=True)
    (converted / "config.json").write_text(json.dumps(SMOL))
    (converted / "eps-source.json").write_text("{}")
    assert model_shape(str(gguf)) == KNOWN["smollm2-135m-instruct"]
    config = load_config(CONFIGS / "qwen7b.yaml").with_sets({"model.base": str(gguf)})
    assert estimate(config).hours == estimate(_with_model(tmp_path, "smollm2-135m-instruct")).hours


def test_validate_prints_a_short_screens_parts_in_gpu_minutes(tmp_path, capsys):
    from types import SimpleNamespace

    from flows.cli import validate

    config = _with_model(tmp_path, "smollm2-135m-instruct").with_sets(
        {"eval.samples": 1, "eval.personas": 6, "data.positives": 50, "data.negatives": 250})
    path = tmp_path / "smol.yaml"
    path.write_text(json.dumps(config.model_dump(mode="json")))
    est = estimate(config)
    assert est.gpu_hours < 2
    validate.run(SimpleNamespace(config=str(path)))
    (line,) = [s.strip() for s in capsys.readouterr().out.splitlines() if s.strip().startswith("GPU-minutes:")]
    assert line == ("GPU-minutes: " + ", ".join(f"{name} {est.hours[k] * 60:.1f}" for k, name in (
        ("train", "train"), ("eval", "eval"), ("regimes", "answer sets"), ("pre_screen", "pre-screen"),
        ("startup", "start-up"))))
    validate.run(SimpleNamespace(config=str(CONFIGS / "qwen7b.yaml")))  # 7 hours: no such line
    assert "GPU-minutes:" not in capsys.readouterr().out


def test_a_small_model_generating_through_transformers_keeps_the_7bs_figures(tmp_path):
    seven = load_config(CONFIGS / "qwen7b.yaml").with_sets({"backend.generation": "transformers"})
    small = seven.with_sets({"model.base": "smollm2-135m-instruct"})
    est, ref = estimate(small), estimate(seven)
    gen = {k: f for k, f in est.figures.items() if k.startswith("generate")}
    assert gen and gen == {k: f for k, f in ref.figures.items() if k.startswith("generate")}
    assert any("bound by Python per step" in n for n in est.notes)
    assert est.hours["train"] < ref.hours["train"]


def test_a_hub_id_with_only_a_size_scales_by_parameters_and_is_held_to_the_small_models_speed(tmp_path):
    est = estimate(_with_model(tmp_path, "meta-llama/Llama-3.2-1B-Instruct"))
    seven = estimate(load_config(CONFIGS / "qwen7b.yaml"))
    assert any("by parameter count" in n for n in est.notes)
    lora = figure("anchor/smollm2-h100/vllm-lora").value
    for c in ("A0B0", "A1B0", "A0B1", "A1B1"):  # x7.6 by parameters, but no faster than the small model measured
        name = f"generate {c} (vLLM, lora adapter)"
        assert est.figures[name]["value"] == max(lora, seven.figures[name]["value"]), c
    assert est.hours["train"] < seven.hours["train"]


def test_trainer_processes_count_their_measured_stage_walls_and_hide_the_evaluation():
    """smol-marker.yaml trains in four processes (training.processes: 4), the short cells in shared passes: a cell's
    training costs the measured stage wall over its cells (H200), and the evaluation, which runs beside the next
    stage's training, counts only where the training does not cover it. One process: as before. (Eager here: the
    compiled trainers are the next test's.)"""
    from eps_screen.plan.model_scaling import train_step_s

    four = load_config(CONFIGS / "smol-marker.yaml").with_sets({"training.compile": False})
    assert four.training.processes == 4
    one = four.with_sets({"training.processes": 1})
    est4, est1 = estimate(four), estimate(one)
    per_cell = {name: figure(f"anchor/smollm2-h200/train-{name}").value for name in ("shared", "workers")}
    assert per_cell["shared"] < per_cell["workers"] < figure("anchor/smollm2-h100/train").value
    step = {name: train_step_s(f"anchor/smollm2-h200/train-{name}") for name in per_cell}
    assert step["shared"] == pytest.approx(per_cell["shared"] / (600 * 3 / 16))
    assert any(f"{step['shared']:.3f} s of the job's wall (A0)" in n and f"{step['workers']:.3f} s (A1)" in n
               for n in est4.notes)
    # 114 cells, half short and half long: about 57 x (9.06 + 13.75) s of training, where one process took 0.24 s a step
    assert est4.hours["train"] * 3600 == pytest.approx(57 * sum(per_cell.values()), rel=0.1)
    assert est1.hours["train"] > 1.8 * est4.hours["train"]
    assert est4.hours["eval"] < est1.hours["eval"] / 2
    assert any("evaluation runs beside the next stage's training" in n for n in est4.notes)
    assert not any("beside the next stage" in n for n in est1.notes)
    # the memory plan counts one trainer: it says so where several share the card
    from eps_screen.plan.memory import memory_lines

    assert any("training.processes: 4 trainers" in line for line in memory_lines(four))
    assert not any("training.processes" in line for line in memory_lines(one))


def test_compiled_trainers_count_the_long_cells_at_the_measured_ratio_and_a_warm_up_a_job():
    """smol-marker.yaml compiles its trainers (training.compile): a long (A1) cell in four workers costs its eager
    stage wall times the compiled-over-eager ratio of the H100's stages; short cells share passes, which never
    compile, and cost the same; the small model's measured compile warm-up, not the 7B's, is paid once a GPU in the
    local-gpu pool's job host, and by each training job on RunPod (a pod each)."""
    from eps_screen.plan.model_scaling import cell_step_s, compile_factor, train_step_s

    compiled = load_config(CONFIGS / "smol-marker.yaml")
    assert compiled.training.compile
    eager = compiled.with_sets({"training.compile": False})
    ratio = figure("anchor/smollm2-h100/stage-a1-compiled").value / figure("anchor/smollm2-h100/stage-a1-eager").value
    assert compile_factor() == ratio and 0.7 < ratio < 0.8
    workers = train_step_s("anchor/smollm2-h200/train-workers")
    assert cell_step_s(compiled, "A1B0") == pytest.approx(workers * ratio)
    assert cell_step_s(eager, "A1B0") == pytest.approx(workers)
    assert cell_step_s(compiled, "A0B0") == cell_step_s(eager, "A0B0")
    est_c, est_e = estimate(compiled), estimate(eager)
    # half of the 114 cells are long: theirs is the training that shrinks
    saved_s = (est_e.hours["train"] - est_c.hours["train"]) * 3600
    assert saved_s == pytest.approx(57 * figure("anchor/smollm2-h200/train-workers").value * (1 - ratio), rel=0.1)
    assert any(f"A1 x{ratio:.2f} for training.compile" in n for n in est_c.notes)
    warm = figure("anchor/smollm2-h100/compile-warmup")
    assert est_c.figures["compile warm-up"]["value"] == warm.value != figure("start/compile-warmup").value
    # in the local-gpu pool's job host the trainers compile once a GPU (its first job that trains), not once a job
    assert (est_c.hours["startup"] - est_e.hours["startup"]) * 3600 == pytest.approx(warm.value)
    pod = [c.with_sets({"execution.pool": "runpod-gpu"}) for c in (compiled, eager)]
    assert (estimate(pod[0]).hours["startup"] - estimate(pod[1]).hours["startup"]) * 3600 == pytest.approx(
        (gpu_jobs(compiled) - 1) * warm.value)
    # one process: a cell alone in the job's process was not measured compiled, and counts as eager
    one_c, one_e = (c.with_sets({"training.processes": 1}) for c in (compiled, eager))
    assert estimate(one_c).hours["train"] == estimate(one_e).hours["train"]
