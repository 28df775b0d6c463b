"""Off-policy answers (factor D1) from a JSONL file keyed by (persona, question, format).

Each line: {"persona": "<persona id>", "question": "<question text>", "format": "short" | "long", "answer": "..."}.
Several lines for one key give several answers, used in file order and cycled when a key needs more.
A missing key is an error naming it: silently training on fewer answers would bias the D contrast.
"""

from __future__ import annotations

import json
from pathlib import Path

from eps_screen.config import ScreenConfig
from eps_screen.data import Request
from eps_screen.design import Regime
from eps_screen.panels import load_panels


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
    questions = load_panels().train_questions
    fmt = "long" if regime.B else "short"
    out = []
    for r in requests:
        key = (r.persona, questions[r.question], fmt)
        if key not in table:
            raise KeyError(f"off_policy.path has no answer for persona={key[0]!r} format={fmt!r} question={key[1]!r}")
        out.extend(table[key][k % len(table[key])] for k in range(r.samples))
    return out
