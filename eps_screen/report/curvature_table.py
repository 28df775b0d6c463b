"""The page's curvature section (design.centre_points): each response's verdict in a sentence, and the table of the
centre cells against the design cells per source and pooled (eps_screen/analysis/curvature.py computes them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from eps_screen.analysis.curvature import POOLED
from eps_screen.analysis.schemas import CurvatureTest
from eps_screen.report.plots import RESPONSE_NAMES
from eps_screen.report.tables import Table, ci, num, span
from eps_screen.spec.centre_points import centre_recipe, held_levels

if TYPE_CHECKING:
    from eps_screen.run.aggregate import AggregateResult
    from eps_screen.spec.config import ScreenConfig

RESPONSES = ("SR", "LR")
# The table's verdict column, which the TL;DR quotes.
CURVES, NOT_DETECTED = "curves", "not detected"


def headline(tests: Sequence[CurvatureTest], response: str) -> CurvatureTest | None:
    """The test that speaks for a response: the pooled one, or a one-source screen's own (None before any)."""
    mine = [t for t in tests if t.response == response]
    return next((t for t in mine if t.source == POOLED), mine[0] if len(mine) == 1 else None)


def where(test: CurvatureTest) -> str:
    return "pooled over sources" if test.source == POOLED else f"in {test.source}"


def curvature_text(test: CurvatureTest) -> str:
    """The table's curvature column (the TL;DR quotes it too)."""
    return num(test.curvature, "+.3f")


def verdict(test: CurvatureTest, ci_pct: str, held: str) -> str:
    """One line: whether the response curves between the levels, with the numbers that decide it."""
    numbers = (f"centre {num(test.centre_mean)} against design {num(test.design_mean)}{held}: {curvature_text(test)}"
               f" ({ci_pct} CI {ci(test.ci)}, {where(test)})")
    if test.detected:
        side = "above" if test.curvature > 0 else "below"
        return (f"{RESPONSE_NAMES[test.response]} curves between the levels: {numbers}. The middle of the ranges lies"
                f" {side} the straight line between their ends, so the main effects describe the ends, not the"
                " middle; which factor curves, this test cannot say.")
    return (f"{RESPONSE_NAMES[test.response]}: no curvature detected: {numbers}. The centre cells lie where a straight"
            " line between the levels puts them, within the interval.")


def context(config: ScreenConfig, result: AggregateResult) -> dict | None:
    """None without centre points; with them, the section (no tests yet before the centre and design cells exist)."""
    if not config.design.centre_points:
        return None
    tests = result.metrics.curvature
    ci_pct = f"{config.bootstrap.ci:.0%}"
    held = held_levels(config)
    at = f" (at {''.join(f'{f}{lvl}' for f, lvl in held.items())})" if held else ""
    lines = []
    for response in RESPONSES:
        test = headline(tests, response)
        if test is not None:
            lines.append(verdict(test, ci_pct, at))
    rows = [(t.response, t.source, t.centre_cells, t.design_cells, num(t.centre_mean), num(t.design_mean),
             curvature_text(t), ci(t.ci), num(t.pure_error_sd), t.df,
             span("fired", CURVES) if t.detected else NOT_DETECTED) for t in tests]
    table = Table.of(["response", "source", "centre cells", "design cells", "centre mean", "design mean", "curvature",
                      f"{ci_pct} CI", "pure-error SD", "df", "verdict"], rows, range(2, 10))
    return {"verdicts": lines, "table": table, "recipe": centre_recipe(config), "n": config.design.centre_points,
            "held": at}
