"""Several engines of one model as one generator (eval.vllm_engines): a call's jobs dealt out whole and answered in
the call's order, each engine's share of the card, sleep and wake reaching every engine, and an error in one engine
raised once all have answered. On the CPU with the transformers backend and the tiny off-policy model: the group's
machinery is the backend's business only inside each child."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from eps_screen.generation import GenerationParams, Prompt
from eps_screen.generation.backends import make_generator
from eps_screen.generation.engine_group import EngineGroup, deal, member_config
from tests.conftest import tiny_config

GIB = 2**30
PROMPTS = [Prompt("You are a librarian.", "How do I store fresh herbs?"),
           Prompt(None, "Why is the sky blue? Answer in one sentence."),
           Prompt("You are a surgeon.", "What should I pack for a weekend trip?")]


def test_jobs_are_dealt_whole_the_largest_first_to_the_least_loaded_engine():
    shares = deal([5, 1, 4, 4, 2], 2)
    assert sorted(i for s in shares for i in s) == [0, 1, 2, 3, 4]  # every job once
    loads = [sum([5, 1, 4, 4, 2][i] for i in s) for s in shares]
    assert sorted(loads) == [8, 8]
    assert deal([3], 4) == [[0], [], [], []]  # fewer jobs than engines: the rest idle
    assert deal([2, 2, 2, 2, 2, 2, 2, 2], 4) == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_each_engine_gets_its_share_of_the_free_card_and_a_fixed_kv_cache(tmp_path):
    config = tiny_config(tmp_path)
    member = member_config(config, 4, free_bytes=78 * GIB, total_bytes=80 * GIB, margin_gib=6.0)
    ev = member.eval
    assert ev.vllm_engines == 1 and ev.vllm_gpu_memory_utilization == pytest.approx(18 / 80, abs=1e-4)
    assert ev.vllm_kv_cache_gib == pytest.approx(0.6 * 18, abs=0.01)
    assert config.eval.vllm_engines == 1 and config.eval.vllm_kv_cache_gib is None  # the job's config is untouched
    own = tiny_config(tmp_path, eval={"vllm_kv_cache_gib": 5.0})
    assert member_config(own, 4, 78 * GIB, 80 * GIB, 6.0).eval.vllm_kv_cache_gib == 5.0
    with pytest.raises(RuntimeError, match=r"eval.vllm_engines"):
        member_config(config, 8, free_bytes=20 * GIB, total_bytes=80 * GIB, margin_gib=6.0)


@pytest.mark.slow
def test_a_group_answers_as_one_engine_would_and_sleeps_and_wakes_every_engine(tmp_path):
    config = tiny_config(tmp_path, backend={"generation": "transformers", "training": "trl"})
    params = [GenerationParams(max_new_tokens=8, temperature=1.0, samples=2, seed=7 + i) for i in range(3)]
    jobs = [(PROMPTS, None), (PROMPTS[1:], None), (PROMPTS[:1], None)]
    group = EngineGroup("transformers", "tiny-alt", config, 2)
    try:
        assert all(m.built and m.process.is_alive() for m in group.members)
        far = group.generate_many(jobs, params)
        group.sleep()
        group.wake()
        assert group.generate_many(jobs, params) == far
        with pytest.raises(RuntimeError, match=r"engine process of tiny-alt failed:"):
            group.generate_many([(PROMPTS, str(tmp_path / "no-such-adapter")), *jobs[1:]], params)
        assert group.generate_many(jobs, params) == far, "the group serves on after an error"
        s = group.stats
        assert s["engines"] == 2 and s["process_start_s"] == max(m.stats["process_start_s"] for m in group.members)
    finally:
        group.close()
    assert all(m.process.exitcode == 0 for m in group.members)
    here = make_generator("transformers", "tiny-alt", config)
    try:
        assert here.generate_many(jobs, params) == far
    finally:
        here.close()
    assert [len(a) for a in far[0]] == [2, 2, 2] and [len(a) for a in far[2]] == [2]


class _FirstMember:
    """A first engine as the group polls it: built at its `built_at`th poll, its compiled model saved (where
    `saves`) at its second, as vLLM saves it before profiling and capturing graphs."""

    def __init__(self, saves: Path | None, built_at: int):
        self.saves, self.built_at, self.polls = saves, built_at, 0

    def poll_built(self, timeout: float) -> bool:
        self.polls += 1
        if self.saves is not None and self.polls == 2:
            self.saves.parent.mkdir(parents=True)
            self.saves.write_bytes(b"compiled")
        return self.polls >= self.built_at


def test_on_a_cold_cache_the_others_start_once_the_first_engine_has_saved_its_compiled_model(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    aot = tmp_path / "torch_compile_cache" / "torch_aot_compile"
    older = aot / "other-model" / "rank_0_0" / "model"  # another model's, saved before: no signal
    older.parent.mkdir(parents=True)
    older.write_bytes(b"compiled")

    saving = SimpleNamespace(members=[_FirstMember(aot / "this-model" / "rank_0_0" / "model", built_at=50)])
    EngineGroup._first_compiles(saving, poll_s=0.0)
    assert saving.members[0].polls == 2 and saving.first_alone["others_started_on"] == "compile_saved"

    no_aot = SimpleNamespace(members=[_FirstMember(None, built_at=4)])  # vLLM's AOT compile off: nothing saved
    EngineGroup._first_compiles(no_aot, poll_s=0.0)
    assert no_aot.members[0].polls == 4 and no_aot.first_alone["others_started_on"] == "first_built"


@pytest.mark.slow
def test_a_group_built_one_first_starts_the_others_after_it_where_no_compiled_model_is_saved(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    config = tiny_config(tmp_path, backend={"generation": "transformers", "training": "trl"})
    group = EngineGroup("transformers", "tiny-alt", config, 2, build_one_first=True)
    try:
        first, other = group.members
        assert first.built and other.built and group.stats["others_started_on"] == "first_built"
        assert other._building >= first._building + first.stats["process_start_s"]
        params = GenerationParams(max_new_tokens=4, temperature=1.0, samples=1, seed=3)
        assert [len(a) for a in group.generate_many([(PROMPTS, None), (PROMPTS[:1], None)], params)] == [3, 1]
    finally:
        group.close()


def test_the_base_models_vllm_engine_alone_is_ever_a_group(tmp_path, monkeypatch):
    from eps_screen.models import loading
    from eps_screen.run import engines

    config = tiny_config(tmp_path, backend={"generation": "vllm", "training": "trl"}, eval={"vllm_engines": 4})
    assert engines._engine_count(config, config.model.base) == 1  # no GPU here: one engine
    monkeypatch.setattr(loading, "device", lambda: "cuda")
    assert engines._engine_count(config, config.model.base) == 4
    assert engines._engine_count(config, "tiny-alt") == 1  # the off-policy model's engine serves no cells
    other = tiny_config(tmp_path, backend={"generation": "transformers", "training": "trl"}, eval={"vllm_engines": 4})
    assert engines._engine_count(other, other.model.base) == 1


@pytest.mark.slow
def test_a_job_asking_for_the_base_engine_gets_the_group_and_training_puts_it_to_sleep(tmp_path, monkeypatch):
    import torch

    from eps_screen.run import engines

    config = tiny_config(tmp_path, backend={"generation": "transformers", "training": "trl"}, eval={"vllm_engines": 2})
    for registry in ("_GENERATORS", "_PREPARED", "_RELEASED"):
        monkeypatch.setattr(engines, registry, {})
    monkeypatch.setattr(engines, "_engine_count", lambda cfg, ref: cfg.eval.vllm_engines)  # as on a GPU
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (78 * GIB, 80 * GIB))
    slept = []
    monkeypatch.setattr(EngineGroup, "sleep", lambda self: slept.append(self))
    gen = engines.generator(config, config.model.base)
    try:
        assert isinstance(gen, EngineGroup) and len(gen.members) == 2
        params = GenerationParams(max_new_tokens=6, temperature=1.0, samples=1, seed=3)
        answers = gen.generate_many([(PROMPTS, None), (PROMPTS[:2], None)], params)
        with engines.training():
            pass
        assert slept == [gen] and engines.generator(config, config.model.base) is gen  # asleep, not ended
        assert answers[1] == make_generator("transformers", config.model.base, config).generate(PROMPTS[:2], params)
    finally:
        gen.close()
