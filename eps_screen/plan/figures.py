"""The measured figures the estimate prices a screen with: eps_screen/plan/figures.json, read the same way from a
checkout or an installed copy.

Each entry names what was measured, its value and unit, the card, the date, the command that measured it and its
result file under benchmarks/results/ (null for the few that are assumed or were measured by hand; their note says
which). tests/test_figures.py checks every entry against its result file in a checkout; BENCHMARKS.md shows the
table. A new measurement reaches the estimate by a new or changed entry here, with its result file committed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

RESULTS = "benchmarks/results/"


@dataclass(frozen=True)
class Figure:
    value: float
    unit: str
    source: str  # the result file(s), or what stands in for one
    note: str = ""


@cache
def entries() -> dict[str, dict]:
    """Every figure's entry, by key (kind/setting/condition...)."""
    return json.loads(files("eps_screen.plan").joinpath("figures.json").read_text(encoding="utf-8"))


def entry(key: str) -> dict | None:
    return entries().get(key)


def figure(key: str, note: str | None = None) -> Figure | None:
    """The entry as a Figure citing its result file (None where there is no such entry)."""
    e = entry(key)
    if e is None:
        return None
    source = RESULTS + e["result"] if e.get("result") else e.get("source", "not measured")
    return Figure(e["value"], e["unit"], source, e.get("note", "") if note is None else note)


def keyed(prefix: str) -> dict[str, dict]:
    """The entries whose key starts with `prefix`, by the rest of their key."""
    return {k[len(prefix):]: e for k, e in entries().items() if k.startswith(prefix)}
