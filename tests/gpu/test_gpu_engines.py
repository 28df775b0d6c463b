"""GPU tier: two models' vLLM engines share one card as a job with off-policy cells shares it (eps_screen.run.engines).

The base model's engine runs in this process and sleeps while the off-policy model's engine runs in a process of
its own (generation.engine_process: vLLM's sleep acts on every engine of a process); that process ends, the card
goes to training, and the base engine wakes. Both models are the tiny shape with the same random weights under
two paths, so the child's seeded answers must equal the base engine's, and the base engine's answers after its
wake must equal its answers before: the wake mapped its own weights back, not the other engine's memory. Needs
only torch, transformers and vLLM (no Prefect): the whole job through the `job` flow is test_gpu_job.py's
off_policy test. Writes gpu_engines_test.json ($OUT there, else test-output/) with each engine's times and the
free memory at each step.

    python -m pytest -m gpu tests/gpu/test_gpu_engines.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _free_gib() -> float:
    return torch.cuda.mem_get_info()[0] / 2**30


def test_the_off_policy_engine_runs_in_its_own_process_beside_the_sleeping_base_engine(tmp_path):
    from benchmarks.gpu_common import job_config, out_dir, seven_b_dir, write
    from eps_screen.generation import GenerationParams, Prompt
    from eps_screen.generation.engine_process import ProcessGenerator
    from eps_screen.run import engines

    if engines.stats():
        pytest.skip("an earlier test's engine is still up: run this file alone")
    base = seven_b_dir(tmp_path / "base", tiny=True)
    off = seven_b_dir(tmp_path / "off-policy", tiny=True)  # the same weights (seeded) under another path
    cache = Path(os.environ.get("EPS_ENGINE_CACHE", "/tmp/eps-engine-cache"))
    config = job_config(base, tmp_path / "store", engine_cache=cache, off_policy={"kind": "model", "model": str(off)})
    prompts = [Prompt("You are a librarian.", f"Question {i}: what should I read next?") for i in range(24)]
    params = GenerationParams(max_new_tokens=48, temperature=1.0, samples=2, seed=7)
    free = {"at_start": _free_gib()}

    engines.prepare(config, str(off))  # as a job's answer sets do: the child imports while the base engine starts
    gen = engines.generator(config, str(base), trains=True)  # the training base loaded first, as in a job
    before = gen.generate_many([(prompts, None)], params)[0]
    free["base_engine_awake"] = _free_gib()

    child = engines.generator(config, str(off))
    free["off_policy_engine_up"] = _free_gib()
    assert isinstance(child, ProcessGenerator) and child.process.is_alive()
    assert gen.asleep and len(gen.stats["sleep_s"]) == 1, "the base engine must sleep before the other starts"
    from_child = child.generate_many([(prompts, None)], params)[0]

    engines.release(str(off))
    free["off_policy_released"] = _free_gib()
    with engines.training():
        # What training needs: most of the card, with the base engine asleep and the child gone.
        block = torch.empty(int((_free_gib() - 4) * 2**30), dtype=torch.uint8, device="cuda")
        free["held_in_training_gib"] = block.numel() / 2**30
        del block
        torch.cuda.empty_cache()
    after = engines.generator(config, str(base)).generate_many([(prompts, None)], params)[0]
    free["base_engine_awake_again"] = _free_gib()

    stats = engines.stats()
    result = {"device": torch.cuda.get_device_name(), "free_gib": free, "engines": stats,
              "child_exit_code": child.process.exitcode,
              "child_answers_equal": sum(a == b for a, b in zip(from_child, before)) / len(before),
              "answers_after_wake_equal": sum(a == b for a, b in zip(after, before)) / len(before)}
    write(out_dir("test-output") / "gpu_engines_test.json", result)

    assert child.process.exitcode == 0, result
    assert result["child_answers_equal"] == 1.0 and result["answers_after_wake_equal"] == 1.0, result
    assert stats[str(off)]["release_s"] > 0 and not stats[str(off)]["sleep_s"], result
    assert stats[str(off)]["spawned_before_build_s"] > 0, result  # how much of the imports it hid: a figure, not a bound
    assert len(stats[str(base)]["wake_s"]) >= 1, result
    # The child's engine took what the sleeping base engine left; once it ended, the card was free again.
    assert free["off_policy_engine_up"] < free["off_policy_released"] - 10, result
    assert free["held_in_training_gib"] > free["at_start"] / 2, result
