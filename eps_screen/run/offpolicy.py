"""Off-policy answers (factor D1) from a JSONL file, or from a hosted model with every answer kept in the store.

JSONL (`off_policy.kind: jsonl`), keyed by (persona, question, format). Each line: {"persona": "<persona id>",
"question": "<question text>", "format": "short" | "long", "answer": "..."}. Several lines for one key give
several answers, used in file order and cycled when a key needs more. A missing key is an error naming it:
silently training on fewer answers would bias the D contrast.

Hosted (`off_policy.kind: anthropic | openai`, eps_screen/generation/hosted.py). Each answer is written to the store
the moment it arrives, as <screen>/hosted/<key[:2]>/<key>.json, where the key hashes what determines it: the API,
its root URL and model, the system and user prompt, max tokens, temperature, top_p, the regime's seed and which
repeat of that prompt in the regime it is (the k-th sample of one prompt is its own answer). An interrupted or
re-keyed regime therefore re-requests only the answers the store lacks, and a regime whose answers are all there
sends no request and needs no key. Identical prompts in two regimes (a negative persona's question under two
sources) share their answers, as they would share the distribution they are drawn from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

from eps_screen.generation import GenerationParams, Prompt
from eps_screen.panels import panels_of
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import Regime, regime_recipe
from eps_screen.store.result_store import ResultStore, write_json
from eps_screen.train.data import Request, request_prompt

log = logging.getLogger(__name__)


def load_jsonl(path: str | Path) -> dict[tuple[str, str, str], list[str]]:
    table: dict[tuple[str, str, str], list[str]] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        rec = json.loads(line)
        missing = {"persona", "question", "format", "answer"} - set(rec)
        if missing:
            raise ValueError(f"{path}:{n}: missing fields {sorted(missing)}")
        if rec["format"] not in ("short", "long"):
            raise ValueError(f"{path}:{n}: format must be 'short' or 'long', got {rec['format']!r}")
        table.setdefault((rec["persona"], rec["question"].strip(), rec["format"]), []).append(rec["answer"])
    return table


def jsonl_answers(config: ScreenConfig, regime: Regime, requests: list[Request]) -> list[str]:
    """Answers in request order, `samples` per request."""
    table = load_jsonl(config.off_policy.path)
    questions = panels_of(config).train_questions
    fmt = "long" if regime_recipe(config, regime).condition.long_format else "short"
    out = []
    for r in requests:
        key = (r.persona, questions[r.question], fmt)
        if key not in table:
            raise KeyError(f"off_policy.path has no answer for persona={key[0]!r} format={fmt!r} question={key[1]!r}")
        out.extend(table[key][k % len(table[key])] for k in range(r.samples))
    return out


def hosted_key(config: ScreenConfig, prompt: Prompt, params: GenerationParams, repeat: int) -> str:
    op = config.off_policy
    payload = {"api": op.kind, "root": op.api_root, "model": op.model, "system": prompt.system, "user": prompt.user,
               "max_tokens": params.max_new_tokens, "temperature": params.temperature, "top_p": params.top_p,
               "seed": params.seed, "repeat": repeat}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def hosted_answers(config: ScreenConfig, regime: Regime, requests: list[Request], store: ResultStore,
                   params: GenerationParams) -> tuple[list[str], str]:
    """(answers in request order, `samples` per request; the source for `answers_from`)."""
    from eps_screen.generation.hosted import HostedClient

    resolved = regime_recipe(config, regime)
    prompts = [request_prompt(resolved, r) for r in requests for _ in range(r.samples)]
    seen: dict[Prompt, int] = {}
    repeats = []
    for p in prompts:
        seen[p] = seen.get(p, -1) + 1
        repeats.append(seen[p])
    keys = [hosted_key(config, p, params, n) for p, n in zip(prompts, repeats, strict=True)]
    rel = {k: f"{store.screen}/hosted/{k[:2]}/{k}.json" for k in keys}
    remote = set(store.remote.glob(f"{store.screen}/hosted/*/*.json")) if store.remote else set()
    texts: dict[str, str] = {}
    for k in keys:
        path = store.root / rel[k]
        if path.exists() or (rel[k] in remote and store.remote.get(rel[k], path)):
            texts[k] = json.loads(path.read_text())["answer"]
    missing = [i for i, k in enumerate(keys) if k not in texts]
    with HostedClient(config.off_policy) as client:
        log.info("%s: %d of %d answers of %s in the store, requesting %d", client.source, len(keys) - len(missing),
                 len(keys), regime.id, len(missing))

        def keep(j: int, answer) -> None:
            i = missing[j]
            k = keys[i]
            record = {"key": k, "source": client.source, "system": prompts[i].system, "user": prompts[i].user,
                      "params": {"max_tokens": params.max_new_tokens, "temperature": params.temperature,
                                 "top_p": params.top_p, "seed": params.seed},
                      "repeat": repeats[i], "answer": answer.text,
                      "stop_reason": answer.stop_reason, "usage": answer.usage, "received_at": time.time()}
            path = store.root / rel[k]
            write_json(path, record)
            if store.remote:
                store.remote.put(path, rel[k])
            texts[k] = answer.text

        client.complete([prompts[i] for i in missing], params, keep)
        return [texts[k] for k in keys], client.source
