"""Off-policy answers (factor D1) through pipeline.regime_answers with a real store: a JSONL file of answers,
or a second model (`tiny-alt`)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from eps_screen.panels import load_panels
from eps_screen.run import pipeline
from eps_screen.spec import design
from eps_screen.spec.design import Regime
from eps_screen.store.result_store import ResultStore
from eps_screen.train import data
from tests.conftest import tiny_config

SMALL = {
    "data": {"positives": 3, "negatives": 4, "train_questions": 2, "e0_negatives": "eot"},
    "eval": {"personas": 4, "questions": 2, "samples": 1, "max_new_tokens": 12, "temperature": 0.0,
             "random_controls": 0, "batch_size": 16},
}


def _jsonl(path, config, lines_per_key: int = 2):
    """Answers for every persona x training question x format the regimes can ask for."""
    panels = load_panels()
    with path.open("w") as f:
        for persona in panels.eval_personas(config.sources, config.eval.personas):
            for q in range(config.data.train_questions):
                for fmt in ("short", "long"):
                    for k in range(lines_per_key):
                        rec = {"persona": persona, "question": panels.train_questions[q], "format": fmt,
                               "answer": f"{fmt} answer {k} of {persona} to question {q}."}
                        f.write(json.dumps(rec) + "\n")
    return path


def test_jsonl_answers_through_regime_answers(tmp_path):
    config = tiny_config(tmp_path / "store", **SMALL)
    config = config.model_copy(update={"off_policy": config.off_policy.model_copy(
        update={"kind": "jsonl", "path": str(_jsonl(tmp_path / "answers.jsonl", config))})})
    store = ResultStore(tmp_path / "store", config.name)
    regime = Regime("librarian", (("A", 1), ("B", 1), ("C", 0)), 42, off_policy=True)

    answers, generated = pipeline.regime_answers(config, regime, store)
    assert generated
    requests = data.regime_requests(config, regime)
    assert len(answers) == sum(r.samples for r in requests) == config.data.positives + config.data.negatives
    for a in answers:
        # B=1 asks for the long format; samples of one key take the file's lines in order, then cycle.
        assert a["answer"] == f"long answer {a['sample'] % 2} of {a['persona']} to question {a['question']}."
        assert a["positive"] == (a["persona"] == "librarian")
    assert max(a["sample"] for a in answers if a["positive"]) >= 1, "positives repeat a key: samples cycle"
    meta = json.loads((store.regime_dir(config, regime) / "meta.json").read_text())
    assert meta["answers_from"] == f"jsonl:{config.off_policy.path}"

    again, generated_again = pipeline.regime_answers(config, regime, store)
    assert again == answers and not generated_again, "stored answers are reused, not regenerated"

    short = pipeline.regime_answers(config, Regime("librarian", (("A", 1), ("B", 0), ("C", 0)), 42, off_policy=True), store)[0]
    assert all(a["answer"].startswith("short answer") for a in short)


def test_jsonl_missing_key_is_named(tmp_path):
    config = tiny_config(tmp_path / "store", **SMALL)
    path = tmp_path / "answers.jsonl"
    path.write_text(json.dumps({"persona": "librarian", "question": "nope", "format": "short", "answer": "x"}) + "\n")
    config = config.model_copy(update={"off_policy": config.off_policy.model_copy(update={"kind": "jsonl", "path": str(path)})})
    store = ResultStore(tmp_path / "store", config.name)
    with pytest.raises(KeyError, match="persona='librarian' format='short'"):
        pipeline.regime_answers(config, Regime("librarian", (("A", 0), ("B", 0), ("C", 0)), 42, off_policy=True), store)
    assert store.regime_answers(config, Regime("librarian", (("A", 0), ("B", 0), ("C", 0)), 42, off_policy=True)) is None


def test_second_model_answers_through_regime_answers(tmp_path):
    """D1 answers come from off_policy.model (tiny-alt), D0 answers from the base model (tiny)."""
    from eps_screen.generation.transformers_backend import TransformersGenerator
    from eps_screen.models.loading import load_base

    config = tiny_config(tmp_path / "store", **SMALL)
    assert config.off_policy.kind == "model" and config.off_policy.model == "tiny-alt"
    store = ResultStore(tmp_path / "store", config.name)
    off = Regime("librarian", (("A", 0), ("B", 0), ("C", 0)), 42, off_policy=True)
    on = Regime("librarian", (("A", 0), ("B", 0), ("C", 0)), 42, off_policy=False)

    off_answers, _ = pipeline.regime_answers(config, off, store)
    on_answers, _ = pipeline.regime_answers(config, on, store)
    assert json.loads((store.regime_dir(config, off) / "meta.json").read_text())["answers_from"] == "model:tiny-alt"
    assert json.loads((store.regime_dir(config, on) / "meta.json").read_text())["answers_from"] == "model:tiny"

    # Each regime's own prompts (on and off draw their negatives apart), greedy, straight through each model: the
    # stored answers are that model's answers.
    params = pipeline._train_params(config, off.seed, 1)
    for model, regime, answers in (("tiny-alt", off, off_answers), ("tiny", on, on_answers)):
        prompts = [data.request_prompt(design.regime_recipe(config, regime), r) for r in data.regime_requests(config, regime)
                   for _ in range(r.samples)]
        direct = TransformersGenerator(load_base(model, "float32"), batch_size=16).generate(prompts, params)
        assert [a["answer"] for a in answers] == [d[0] for d in direct]
    assert [a["answer"] for a in off_answers] != [a["answer"] for a in on_answers], "two models, two answer sets"


@pytest.mark.parametrize("backend", [
    "transformers",
    pytest.param("vllm", marks=[pytest.mark.slow,
                                pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm")]),
])
def test_a_jobs_answer_sets_take_one_engine_call_per_model(tmp_path, monkeypatch, backend):
    """pipeline.answer_sets, as a GPU job makes its sets: the base model's sets in one engine call, then the
    off-policy model's in one call, after which that engine is released; each set stored with the answers it gets
    when made alone (sampled, so each set's own seed must reach its requests; through vLLM, whatever else is in
    the engine's batch)."""
    from eps_screen.run import engines

    if backend == "vllm":
        from eps_screen.generation.vllm_backend import VLLMGenerator as Engine
    else:
        from eps_screen.generation.transformers_backend import TransformersGenerator as Engine
    monkeypatch.setattr(engines, "_GENERATORS", {})
    try:
        _answer_sets_together_and_alone(tmp_path, monkeypatch, backend, Engine, engines)
    finally:
        for gen in engines._GENERATORS.values():
            gen.close()


def _answer_sets_together_and_alone(tmp_path, monkeypatch, backend, Engine, engines):
    sampled = {**SMALL, "eval": {**SMALL["eval"], "temperature": 1.0},
               "backend": {"generation": backend, "training": "trl"}}
    together_config = tiny_config(tmp_path / "together", **sampled)
    alone_config = tiny_config(tmp_path / "alone", **sampled)
    levels = [(("A", 0), ("B", 0), ("C", 0)), (("A", 1), ("B", 0), ("C", 1))]
    regimes = [Regime(source, lv, seed, off_policy=off) for off in (True, False)
               for source, seed in (("librarian", 42), ("surgeon", 7)) for lv in levels]
    calls, released = [], []
    real_many, real_release = Engine.generate_many, engines.release

    def many(self, jobs, params):
        model = next(ref for (_, ref), gen in engines._GENERATORS.items() if gen is self)
        calls.append((model, len(jobs)))
        return real_many(self, jobs, params)

    def release(model_ref):
        released.append((model_ref, len(calls)))
        real_release(model_ref)

    prepared, real_prepare = [], engines.prepare

    def prepare(config, model_ref):
        prepared.append((model_ref.rsplit("/", 1)[-1], len(engines._GENERATORS)))
        real_prepare(config, model_ref)

    monkeypatch.setattr(Engine, "generate_many", many)
    monkeypatch.setattr(engines, "release", release)
    monkeypatch.setattr(engines, "prepare", prepare)
    store = ResultStore(tmp_path / "together", together_config.name)
    together = pipeline.answer_sets(together_config, regimes, store)
    assert prepared == [("tiny-alt", 0)], "the off-policy engine's process starts before any engine works"
    assert [model.rsplit("/", 1)[-1] for model, _ in calls][-2:] == ["tiny", "tiny-alt"] and [n for _, n in calls] == [4, 4]
    assert released == [("tiny-alt", 2)], "the off-policy engine is released once its sets are made"
    assert list(together) == [r.id for r in regimes]
    meta = json.loads((store.regime_dir(together_config, regimes[0]) / "meta.json").read_text())
    assert meta["sets_in_engine_call"] == 4 and meta["answers_from"] == "model:tiny-alt"

    calls.clear()
    alone_store = ResultStore(tmp_path / "alone", alone_config.name)
    for regime in regimes:
        answers, generated = pipeline.regime_answers(alone_config, regime, alone_store)
        assert generated and answers == together[regime.id], regime.id
    assert [n for _, n in calls] == [1] * len(regimes)
    assert len({json.dumps(a) for a in together.values()}) == len(regimes), "every set is its own"
    # Made once: asked again, every set comes from the store without an engine call.
    calls.clear()
    assert pipeline.answer_sets(together_config, regimes, store) == together and not calls
