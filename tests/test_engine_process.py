"""An engine in a process of its own (eps_screen.generation.engine_process), as a GPU job runs the off-policy
model's: the same answers as the engine in this process, errors with the child's traceback, and closing it ends
the process. On the CPU, with the tiny off-policy model."""

from __future__ import annotations

import importlib.util

import pytest

from eps_screen.generation import GenerationParams, Prompt
from eps_screen.generation.backends import make_generator
from eps_screen.generation.engine_process import ProcessGenerator
from tests.conftest import tiny_config

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
        assert child.release() is True
    assert not child.process.is_alive() and child.process.exitcode == 0
    assert child.stats["release_s"] >= 0 and child.stats["process_start_s"] > 0
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
