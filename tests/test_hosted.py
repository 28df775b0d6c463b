"""Off-policy (D1) answers from a hosted API (Anthropic Messages, OpenAI chat completions) through
pipeline.regime_answers, against a fake endpoint on 127.0.0.1 (tests/fakes/hosted_api.py): the request shape,
the store cache (a second run sends nothing, an interrupted one re-requests only what is missing), retries,
rate limits, and a key that never reaches a log, an artifact or a repr."""

from __future__ import annotations

import json
import logging
import shutil
import time

import pytest

from eps_screen.generation.hosted import HostedClient, HostedError
from eps_screen.panels import load_panels
from eps_screen.run import pipeline
from eps_screen.spec.config import ConfigError, parse_config
from eps_screen.spec.design import Regime
from eps_screen.store.result_store import ResultStore
from eps_screen.train import data
from tests.conftest import tiny_config
from tests.fakes.hosted_api import FakeChatAPI
from tests.test_offpolicy import SMALL

pytestmark = pytest.mark.integration

KEY = "sk-test-Zq8-SECRET-never-logged"
ENV = "EPS_TEST_HOSTED_KEY"
REGIME = Regime("librarian", (("A", 1), ("B", 0), ("C", 1)), 42, off_policy=True)
FAST = {"retry_backoff_s": 0.0, "requests_per_minute": None}


def _config(tmp_path, api: FakeChatAPI, kind: str = "anthropic", **off_policy):
    root = api.url if kind == "anthropic" else f"{api.url}/v1"
    return tiny_config(tmp_path / "store", off_policy={"kind": kind, "model": "fake-model-1", "base_url": root,
                                                       "api_key_env": ENV, **FAST, **off_policy}, **SMALL)


def _run(config, tmp_path, regime=REGIME):
    return pipeline.regime_answers(config, regime, ResultStore(tmp_path / "store", config.name))


def _n_answers(config, regime=REGIME) -> int:
    return sum(r.samples for r in data.regime_requests(config, regime))


def _cached(tmp_path, config) -> list[dict]:
    return [json.loads(p.read_text()) for p in (tmp_path / "store" / config.name / "hosted").glob("*/*.json")]


def test_anthropic_answers_are_stored_and_a_second_run_sends_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, KEY)
    with FakeChatAPI(KEY) as api:
        config = _config(tmp_path, api, max_concurrent=3)
        answers, generated = _run(config, tmp_path)
        n = _n_answers(config)
        assert generated and len(answers) == n == len(api.requests) == config.data.positives + config.data.negatives

        # The Messages API's request shape, per prompt of the regime (A1, B0, C1 under each persona).
        panels = load_panels()
        for r in api.requests:
            assert r.path == "/v1/messages" and r.headers["anthropic-version"] == "2023-06-01"
            assert r.headers["x-api-key"] == KEY and "authorization" not in r.headers
            assert r.body["model"] == "fake-model-1" and r.body["max_tokens"] == config.eval.max_new_tokens
            assert r.body["temperature"] == config.eval.temperature and "top_p" not in r.body
            assert r.body["system"].startswith("Background context:")  # C1 framing, A1 long text after it
            assert [m["role"] for m in r.body["messages"]] == ["user"]
            assert r.body["messages"][0]["content"].endswith(config.texts.format_short)
        # Each stored answer is the API's answer to that answer's own prompt; samples of one prompt differ.
        for a in answers:
            assert a["answer"].startswith("answer #") and panels.train_questions[a["question"]] in a["answer"]
        assert len({a["answer"] for a in answers}) == n
        store = ResultStore(tmp_path / "store", config.name)
        meta = json.loads((store.regime_dir(config, REGIME) / "meta.json").read_text())
        assert meta["answers_from"] == f"anthropic:fake-model-1@{api.url}"
        assert len(_cached(tmp_path, config)) == n

        # A second run: the regime is finished, nothing is sent.
        assert _run(config, tmp_path) == (answers, False) and len(api.requests) == n
        # A regime re-keyed (rate limits changed) or lost: every answer comes from the store, still nothing is sent,
        # and no key is needed.
        monkeypatch.delenv(ENV)
        shutil.rmtree(tmp_path / "store" / config.name / "regimes")
        again, generated = _run(_config(tmp_path, api, max_concurrent=1), tmp_path)
        assert generated and again == answers and len(api.requests) == n


def test_an_interrupted_run_requests_only_the_missing_answers(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, KEY)
    with FakeChatAPI(KEY, outage_after=3) as api:
        config = _config(tmp_path, api, kind="openai", max_concurrent=1)
        n = _n_answers(config)
        with pytest.raises(HostedError, match=r"HTTP 400: Your credit balance is too low"):
            _run(config, tmp_path)
        # The outage stopped the batch at its first error: three answers kept, no regime written.
        assert len(api.requests) == 4 and len(_cached(tmp_path, config)) == 3
        store = ResultStore(tmp_path / "store", config.name)
        assert store.regime_answers(config, REGIME) is None
        first = {c["answer"] for c in _cached(tmp_path, config)}

        api.outage_after = None  # credit topped up
        answers, generated = _run(config, tmp_path)
        assert generated and len(answers) == n
        assert len(api.requests) == 4 + (n - 3), "only the missing answers are requested"
        assert first <= {a["answer"] for a in answers}, "the answers paid for before the outage are used"
        r = api.requests[-1]
        assert r.path == "/v1/chat/completions" and r.headers["authorization"] == f"Bearer {KEY}"
        assert [m["role"] for m in r.body["messages"]] == ["system", "user"] and r.body["n"] == 1


def test_429_and_5xx_are_retried_then_given_up(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(ENV, KEY)
    retry_now = {"retry-after": "0"}
    script = {0: (429, retry_now, {"error": {"message": "rate limited"}}),
              1: (503, {}, {"error": {"message": "unavailable"}}),
              2: (529, {}, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})}
    with FakeChatAPI(KEY, script=script) as api:
        config = _config(tmp_path, api, max_concurrent=1, max_retries=3)
        with caplog.at_level(logging.WARNING, logger="eps_screen.generation.hosted"):
            answers, _ = _run(config, tmp_path)
        n = _n_answers(config)
        assert len(answers) == n and len(api.requests) == n + 3 and [r.status for r in api.requests[:4]] == [429, 503, 529, 200]
        assert sum("retry" in m for m in caplog.messages) == 3

    always = {i: (500, {}, {"error": {"message": "boom"}}) for i in range(10)}
    with FakeChatAPI(KEY, script=always) as api:
        config = _config(tmp_path / "b", api, max_concurrent=1, max_retries=2)
        with pytest.raises(HostedError, match="HTTP 500 after 3 attempts: boom"):
            _run(config, tmp_path / "b")
        assert len(api.requests) == 3, "one prompt, three attempts, then the batch stops"


def test_rate_limits_cap_concurrency_and_pace_the_starts(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, KEY)
    with FakeChatAPI(KEY, delay_s=0.05) as api:
        config = _config(tmp_path, api, max_concurrent=2, requests_per_minute=1200)  # one start per 50 ms
        started = time.monotonic()
        _run(config, tmp_path)
        assert api.max_in_flight == 2
        starts = sorted(r.start for r in api.requests)
        assert time.monotonic() - started >= 0.05 * (len(starts) - 1)
        assert starts[-1] - starts[0] >= 0.8 * 0.05 * (len(starts) - 1)  # as the server saw them, less some jitter


def test_the_key_never_reaches_a_log_an_artifact_or_a_repr(tmp_path, monkeypatch, caplog, capsys):
    monkeypatch.setenv(ENV, KEY)
    with caplog.at_level(logging.DEBUG), FakeChatAPI(KEY, script={2: (503, {}, {"error": {"message": "x"}})}) as api:
        config = _config(tmp_path, api, max_concurrent=2)
        _run(config, tmp_path)
        client = HostedClient(config.off_policy)
        shown = [repr(config), str(config.model_dump()), repr(client), repr(vars(client))]
        client.close()
        # A server that quotes the key it got (the fake does on a 401) has it redacted from the error.
        monkeypatch.setenv(ENV, KEY + "-revoked")
        with pytest.raises(HostedError) as err:
            _run(config, tmp_path, Regime("librarian", (("A", 0), ("B", 1), ("C", 0)), 42, off_policy=True))
        assert "HTTP 401" in str(err.value) and "[key]" in str(err.value)
    assert len(api.requests) >= 2
    out = capsys.readouterr()
    texts = [*shown, str(err.value), repr(err.value), caplog.text, out.out, out.err]
    texts += [p.read_bytes().decode("utf-8", "replace") for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert len(texts) > 10 and not [t for t in texts if KEY in t]
    assert caplog.text, "the logs were captured"


def test_a_missing_key_fails_before_any_request(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    with FakeChatAPI(KEY) as api:
        with pytest.raises(HostedError, match=f"environment variable {ENV} .* is not set"):
            _run(_config(tmp_path, api), tmp_path)
        assert api.requests == []


def test_hosted_config_is_checked_without_echoing_what_was_given():
    def problems(off_policy):
        with pytest.raises(ConfigError) as err:
            parse_config({"off_policy": off_policy})
        return err.value.problems

    pasted = problems({"kind": "anthropic", "model": "claude-x", "api_key_env": KEY})
    assert pasted[0].startswith("off_policy: api_key_env must be the NAME of an environment variable")
    assert KEY not in " ".join(pasted)
    url = problems({"kind": "openai", "model": "m", "base_url": f"https://api.example.com/v1?key={KEY}"})
    assert url[0].startswith("off_policy: base_url must be an http(s) URL") and KEY not in url[0]
    assert problems({"kind": "anthropic"}) == ["off_policy: kind 'anthropic' needs off_policy.model, the API's model name"]
    assert problems({"kind": "model", "api_key_env": "X"})[0].startswith("off_policy: base_url and api_key_env apply")
    assert problems({"kind": "jsonl", "path": "a.jsonl", "vllm_kv_cache_dtype": "fp8"}) == [
        "off_policy: vllm_kv_cache_dtype applies to kind 'model' only (a local engine): remove it, or set kind: model"
        " (it is 'jsonl')"]
    assert problems({"kind": "anthropic", "model": "m", "vllm_quantization": "fp8"}) == [
        "off_policy: vllm_quantization applies to kind 'model' only (a local engine): remove it, or set kind: model"
        " (it is 'anthropic')"]
    ok = parse_config({"off_policy": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:8000/v1/"}}).off_policy
    assert (ok.api_root, ok.key_env) == ("http://127.0.0.1:8000/v1", "OPENAI_API_KEY")
    assert parse_config({"off_policy": {"kind": "anthropic", "model": "claude-x"}}).off_policy.api_root == "https://api.anthropic.com"


def test_a_url_store_shares_the_paid_answers_between_machines(tmp_path, monkeypatch):
    """Machine 1 is cut off midway; machine 2 (its own cache of the same URL store) requests only the rest."""
    monkeypatch.setenv(ENV, KEY)
    url = f"memory://eps-hosted-{tmp_path.name}"
    with FakeChatAPI(KEY, outage_after=4) as api:
        config = _config(tmp_path, api, max_concurrent=1)
        one = ResultStore(url, config.name, cache=tmp_path / "machine-1")
        with pytest.raises(HostedError):
            pipeline.regime_answers(config, REGIME, one)
        assert len(one.remote.glob(f"{config.name}/hosted/*/*.json")) == 4
        api.outage_after = None
        two = ResultStore(url, config.name, cache=tmp_path / "machine-2")
        answers, _ = pipeline.regime_answers(config, REGIME, two)
        assert len(api.requests) == 5 + _n_answers(config) - 4 and len(answers) == _n_answers(config)
        assert one.regime_answers(config, REGIME) == answers  # the regime itself is at the URL too
