"""An engine in a process of its own (eps_screen.generation.engine_process), as a GPU job runs the off-policy
model's: the same answers as the engine in this process, errors with the child's traceback, and closing it ends
the process. On the CPU, with the tiny off-policy model."""

from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys

import pytest

from eps_screen.generation import GenerationParams, Prompt
from eps_screen.generation.backends import make_generator
from eps_screen.generation.engine_process import ProcessGenerator
from tests.conftest import ROOT, tiny_config

pytestmark = pytest.mark.slow

PROMPTS = [Prompt("You are a librarian.", "How do I store fresh herbs?"),
           Prompt(None, "Why is the sky blue? Answer in one sentence."),
           Prompt("You are a surgeon.", "What should I pack for a weekend trip?")]


@pytest.mark.parametrize("backend", [
    "transformers",
    pytest.param("vllm", marks=pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm")),
])
def test_a_child_process_engine_answers_as_this_process_would(tmp_path, backend):
    config = tiny_config(tmp_path, backend={"generation": backend, "training": "trl"})
    sampled = [GenerationParams(max_new_tokens=10, temperature=1.0, samples=2, seed=7),
               GenerationParams(max_new_tokens=6, temperature=1.0, samples=1, seed=8)]
    jobs = [(PROMPTS, None), (PROMPTS[1:], None)]
    child = ProcessGenerator(backend, "tiny-alt", config)
    try:
        assert child.process.is_alive() and child.process.pid is not None
        far = child.generate_many(jobs, sampled)
        assert child.generate(PROMPTS[1:], sampled[1]) == far[1]  # seeded: the same request, the same answers
        with pytest.raises(RuntimeError, match=r"(?s)failed:.*ValueError"):
            child.generate_many(jobs, sampled[:1] * 3)  # one params per job, or one for all: the child says so
        assert child.generate_many(jobs, sampled) == far, "the child serves on after an error"
    finally:
        child.release()
    assert not child.process.is_alive() and child.process.exitcode == 0
    # Where the child's start and end go, each part inside the whole the parent timed around it
    s = child.stats
    assert 0 < s["child_import_s"] and s.get("start_s", 0.0) <= s["child_build_s"]
    assert s["child_import_s"] + s["child_build_s"] <= s["process_start_s"]
    assert 0 <= s["child_shutdown_s"] <= s["release_s"]
    here = make_generator(backend, "tiny-alt", config)
    try:
        assert here.generate_many(jobs, sampled) == far
    finally:
        here.close()
    assert [len(answers) for answers in far[0]] == [2, 2, 2] and [len(a) for a in far[1]] == [1, 1]


def test_a_child_that_cannot_start_its_engine_says_why(tmp_path):
    config = tiny_config(tmp_path / "store")
    empty = tmp_path / "no-model-here"  # a local folder without a model: nothing goes to the network
    empty.mkdir()
    with pytest.raises(RuntimeError, match=rf"(?s)engine process of {empty} failed:.*config.json"):
        ProcessGenerator("transformers", str(empty), config)


def test_a_process_that_never_released_its_engine_still_exits(tmp_path):
    """A job that fails between starting the off-policy engine and releasing it must still end: multiprocessing
    joins the child at exit, and the child waits on a pipe the job holds (before the fix this process hung for good,
    and on a local GPU it would have kept the card)."""
    script = tmp_path / "leave_it_up.py"
    script.write_text(
        "import sys\n"
        "from pathlib import Path\n"
        "from eps_screen.generation.engine_process import ProcessGenerator\n"
        "from tests.conftest import tiny_config\n"
        "if __name__ == '__main__':\n"
        "    gen = ProcessGenerator('transformers', 'tiny-alt', tiny_config(Path(sys.argv[1])))\n"
        "    print(gen.process.pid, flush=True)\n"
        "    raise SystemExit('the job failed before releasing its engine')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # The timeout only turns a hang into a failure; the script needs a fraction of it.
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "store")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and "failed before releasing" in done.stderr, done.stderr[-2000:]
    child = int(done.stdout.split()[-1])
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # the engine's process ended with the job's


def test_an_engine_dropped_without_release_ends_its_process(tmp_path):
    gen = ProcessGenerator("transformers", "tiny-alt", tiny_config(tmp_path))
    process = gen.process
    del gen
    gc.collect()
    assert not process.is_alive() and process.exitcode == 0


def test_a_process_started_ahead_of_its_engine_imports_first_and_builds_when_asked(tmp_path, monkeypatch):
    """A job starts the off-policy engine's process before the base engine works (engines.prepare): its imports
    are done by the time the card is free, so building the engine waits for none of them; training leaves such a
    process alone (it holds no engine yet), and one never built ends when closed."""
    from eps_screen.run import engines

    config = tiny_config(tmp_path, backend={"generation": "transformers", "training": "trl"})
    for registry in ("_GENERATORS", "_PREPARED", "_RELEASED"):
        monkeypatch.setattr(engines, registry, {})
    monkeypatch.setattr(engines, "_own_process", lambda cfg, ref: ref == "tiny-alt")  # as on a GPU
    engines.prepare(config, "tiny-alt")
    child = engines._PREPARED[("transformers", "tiny-alt")]
    assert not engines.stats() and not child.built
    with engines.training():
        pass
    # The bound only turns a hang into a failure: the imports take seconds.
    assert child.process.is_alive() and child.ready_to_build(timeout=600)
    gen = engines.generator(config, "tiny-alt")
    assert gen is child and child.built and not engines._PREPARED
    assert child.stats["imports_waited_s"] == 0.0 and child.stats["child_import_s"] > 0
    params = GenerationParams(max_new_tokens=6, temperature=1.0, samples=1, seed=3)
    assert gen.generate(PROMPTS, params) == make_generator("transformers", "tiny-alt", config).generate(PROMPTS, params)
    engines.release("tiny-alt")
    assert child.process.exitcode == 0

    never_built = ProcessGenerator("transformers", "tiny-alt", config, build=False)
    never_built.close()
    assert not never_built.process.is_alive() and never_built.process.exitcode == 0


def test_an_engine_in_its_own_process_is_built_with_the_training_base_set_aside(tmp_path, monkeypatch):
    """On a GPU the off-policy engine has the card to itself: the job asks for it with trains=True, as for the
    base's engine, yet the loaded training base goes to host memory before that engine is built and nothing loads
    it back until training asks (engines.generator). On the CPU nothing moves; the order is what is checked."""
    from eps_screen.models import loading as models
    from eps_screen.run import engines

    config = tiny_config(tmp_path, backend={"generation": "transformers", "training": "trl"})
    for registry in ("_GENERATORS", "_PREPARED", "_RELEASED"):
        monkeypatch.setattr(engines, registry, {})
    monkeypatch.setattr(engines, "_own_process", lambda cfg, ref: ref == "tiny-alt")  # as on a GPU
    events = []
    to_host, training_base, build = models.bases_to_host, engines.training_base, ProcessGenerator.__init__
    monkeypatch.setattr(models, "bases_to_host", lambda: events.append("to host") or to_host())
    monkeypatch.setattr(engines, "training_base", lambda cfg: events.append("training base") or training_base(cfg))

    def building(self, *args, **kwargs):
        events.append("build")
        build(self, *args, **kwargs)

    monkeypatch.setattr(ProcessGenerator, "__init__", building)
    engines.generator(config, config.model.base, trains=True)
    child = engines.generator(config, "tiny-alt", trains=True)
    assert events == ["training base", "to host", "build"]
    params = GenerationParams(max_new_tokens=4, temperature=1.0, samples=1, seed=3)
    assert len(child.generate(PROMPTS, params)) == len(PROMPTS)
    engines.release("tiny-alt")
    assert child.process.exitcode == 0
    assert engines.training_base(config).model is models.load_base(
        config.model.base, config.model.dtype, config.model.attn_implementation, config.model.revision).model
