"""`eps-screen design CONFIG`: the designs a config declares, phase by phase: cells, generators, defining relation,
resolution and alias structure (no Prefect). With design.fold_over, the smoke's fold-over and what the two give."""

from __future__ import annotations

import json
import sys

from eps_screen.analysis.cli import design_listing
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import ROMAN, fold_over_cells, phases
from eps_screen.spec.plackett_burman import PlackettBurman
from flows.cli.session import load


def run(args) -> int:
    config = load(args.config)
    code, text = design_listing(config, args.phase, args.json)
    if code == 0 and args.phase in ("smoke", "all") and phases(config).fold_over is not None:
        text = _with_fold_over(config, text, args.json)
    print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code


def fold_over(config: ScreenConfig) -> tuple[dict, list[str]]:
    """The fold-over's cells and design, and the relation of smoke and fold-over together: the smoke's words of
    even length (flipping every level negates the odd ones, so together they cancel)."""
    d = phases(config)
    cells = fold_over_cells(config)
    together = [("-" if s < 0 else "") + w for w, s in d.smoke.relation() if len(w) % 2 == 0]
    res = min((len(w.lstrip("-")) for w in together), default=None)
    if isinstance(d.smoke, PlackettBurman):  # no relation: the folded design is resolution IV, not the full factorial
        res = 4
    data = {"design": d.fold_over.describe(), "count": len(cells), "cells": [c.as_dict() for c in cells],
            "with_smoke": {"runs": 2 * len(cells), "defining_relation": ["I", *together] if together else [],
                           "resolution": res}}
    clear = "main effects clear of two-factor interactions"
    text = [f"fold-over: the smoke fraction with every level flipped, {d.fold_over.describe()}, on {config.smoke}, "
            f"{len(cells)} cells", *(f"  {c.id}" for c in cells),
            f"smoke and fold-over together: {2 * len(cells)} runs, "
            + (f"I = {' = '.join(together)} (resolution {ROMAN.get(res, res)}): {clear}" if together
               else f"resolution IV: {clear} (which stay partially aliased with each other)" if res == 4
               else f"the full factorial: {clear} and of each other")]
    return data, text


def _with_fold_over(config: ScreenConfig, text: str, as_json: bool) -> str:
    data, lines = fold_over(config)
    if not as_json:
        return text + "\n\n" + "\n".join(lines)
    return json.dumps({**json.loads(text), "fold_over": data}, indent=2)
