"""The page's small parts: tables for the template's table macro, and numbers written the page's one way."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
from markupsafe import Markup

from eps_screen.analysis.schemas import Interval

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}


@dataclass(frozen=True)
class Table:
    """A table for the template's table macro: a cell is escaped unless it is Markup; numeric columns align right."""

    headers: Sequence[str]
    rows: Sequence[Sequence[object]]
    numeric: frozenset[int] = frozenset()
    cls: str = ""

    @classmethod
    def of(cls, headers: Sequence[str], rows: Iterable[Sequence[object]], numeric: Iterable[int] = (),
           css: str = "") -> Table | None:
        """The table, or None when it has no rows (the template then says why)."""
        rows = [list(r) for r in rows]
        return cls(list(headers), rows, frozenset(numeric), css) if rows else None


def span(cls: str, text: object) -> Markup:
    return Markup('<span class="{}">{}</span>').format(cls, text)


def num(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def written(x: float, decimals: int, sign: str = "") -> str:
    """`x` to `decimals` places, or to as many more (up to 6) as it takes for a number that is not 0 not to read as
    0: an interval whose bound is +0.003 excludes 0, and "[+0.00, +0.03]" would say it touches it."""
    while decimals < 6 and x != 0 and round(x, decimals) == 0:
        decimals += 1
    return format(x, f"{sign}.{decimals}f")


def ci(iv: Interval, decimals: int = 3) -> str:
    """An interval's bounds, each written so that one which is not 0 never reads as 0 (written)."""
    return "[" + ", ".join("n/a" if x is None else written(x, decimals) for x in (iv.low, iv.high)) + "]"


def p_text(x: float | None) -> str:
    return "n/a" if x is None else ("< 0.001" if x < 0.001 else f"{x:.3f}")


def clear_mark(clear: bool) -> Markup | str:
    """The tables' "clear" column: the one definition (TermEffect.clear), marked the same way everywhere."""
    return span("clear", "clear") if clear else "not clear"


def figure_div(fig: go.Figure, div_id: str) -> Markup:
    """The figure as a <div> + script that draws it with the page's one copy of plotly.js."""
    return Markup(fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOTLY_CONFIG))


def signs(values: Sequence[float | None]) -> str:
    """"+ + -  (flips)": each source's sign (0 where d is 0 or could not be estimated), and whether some are
    positive and some negative, as kill criterion 3 counts a flip."""
    marks = [0 if v is None or math.isnan(v) else (v > 0) - (v < 0) for v in values]
    return " ".join("0+-"[s] for s in marks) + ("  (flips)" if {1, -1} <= set(marks) else "")
