"""Centre points (design.centre_points): cells at the midpoint of every numeric factor, the categorical ones held.

A two-level screen sees a straight line between each factor's levels. N centre cells per source, every numeric
factor at its midpoint, test whether the response curves between them (eps_screen/analysis/curvature.py); their spread
is pure error, so it joins the training-run estimate too. This module holds the declarations: which factors have a
midpoint, its value, and the one-line refusals of what has none.

- A factor whose levels set numbers has a midpoint per field: arithmetic, (low + high) / 2, or geometric,
  sqrt(low x high), by the factor's `midpoint`; left out, geometric for training.learning_rate (a learning rate is
  screened on a log scale: 1e-5 and 1e-4 meet at 3.2e-5, not at 5.5e-5) and arithmetic otherwise.
- A field that takes integers (lora.rank, data.positives) must land on a whole number; one that does not is refused,
  not rounded: a rounded centre is off-centre, and the factor's linear effect would then read as curvature.
- A treatment, or a factor setting text or a switch, has no midpoint: it is held at its declared `centre_level`, and
  the centre cells are compared with the design cells at that level (eps_screen/analysis/curvature.py). A numeric factor
  may be held too.
"""

from __future__ import annotations

import math
import types
import typing
from typing import TYPE_CHECKING

from pydantic import BaseModel

if TYPE_CHECKING:
    from eps_screen.spec.config import Factor, ScreenConfig

LEARNING_RATE = "training.learning_rate"
# A factor's level in a centre cell: half-way, so that its coded value 2 * level - 1 is 0, the centre in the coded
# units every statistic and the simulated backend compute with (a level 0 or 1 gives -1 or +1). Here, below both
# config and design, which read it (config checks the declarations, design makes the cells).
CENTRE = 0.5


def count_problem(n: int) -> str | None:
    """Why design.centre_points cannot be n (None when it can)."""
    if n < 0:
        return "a count of cells cannot be negative; give 0 (no centre points) or 2 or more centre cells per source"
    if n == 1:
        return ("one centre cell per source has no spread for the curvature test to be judged against; give 2 or more"
                " (3 to 5 is usual), or 0 for none")
    return None


def _numeric(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def has_midpoint(factor: Factor) -> bool:
    """Whether every field the factor sets is a number at both levels (a treatment has no midpoint)."""
    low, high = factor.levels
    return low.sets is not None and all(_numeric(low.sets[p]) and _numeric(high.sets[p]) for p in low.sets)


def midpoint_kind(factor: Factor, path: str) -> str:
    return factor.midpoint or ("geometric" if path == LEARNING_RATE else "arithmetic")


def integer_field(root: type[BaseModel], path: str) -> bool:
    """Whether the field at a dotted path of the config model `root` takes integers only (lora.rank: yes;
    training.epochs: no)."""
    model = root
    for part in path.split("."):
        ann = model.model_fields[part].annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
    args = set(typing.get_args(ann)) if isinstance(ann, types.UnionType) or typing.get_origin(ann) else {ann}
    return int in args and float not in args


def _midpoint(kind: str, low: float, high: float) -> float:
    return math.sqrt(low * high) if kind == "geometric" else (low + high) / 2


def midpoint_sets(config: ScreenConfig, factor: Factor) -> dict:
    """The fields a factor at its midpoint sets, each at the centre of its two levels' values (checked valid by
    centre_problems before any cell is made)."""
    low, high = factor.levels
    out = {}
    for path in low.sets or {}:
        value = _midpoint(midpoint_kind(factor, path), low.sets[path], high.sets[path])
        out[path] = int(round(value)) if integer_field(type(config), path) else value
    return out


def centre_sets(config: ScreenConfig) -> dict:
    """Every field the centre cells set: the recipe of a centre cell is the config with these (and held levels)."""
    return {p: v for f in config.design.factors if centred(f) for p, v in midpoint_sets(config, f).items()}


def centred(factor: Factor) -> bool:
    """Whether the centre cells put this factor at its midpoint (else it is held at its centre_level)."""
    return factor.centre_level is None and has_midpoint(factor)


def centre_levels(config: ScreenConfig) -> tuple:
    """The levels of a centre cell, in declared order: CENTRE for a numeric factor, centre_level for a held one."""
    return tuple(CENTRE if centred(f) else f.centre_level for f in config.design.factors)


def held_levels(config: ScreenConfig) -> dict[str, int]:
    """The held factors and their levels: the design cells the centre cells are compared with share them."""
    return {f.short: f.centre_level for f in config.design.factors if not centred(f)}


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _factor_problems(root: type[BaseModel], factor: Factor, wanted: bool) -> list[str]:
    where = f"design: factor {factor.short} ({factor.label})"
    if factor.midpoint is not None and not has_midpoint(factor):
        what = "is a treatment" if factor.levels[0].treatment else "sets a value that is not a number"
        return [f"{where}: midpoint applies to a factor whose levels set numbers, and this one {what}; drop midpoint"
                " (and hold it in the centre cells with centre_level: 0 or 1)"]
    if factor.midpoint is not None and factor.centre_level is not None:
        return [f"{where}: give midpoint (centre cells at its midpoint) or centre_level (held there), not both"]
    if not wanted or factor.centre_level is not None:
        return []
    if not has_midpoint(factor):
        low, high = factor.levels
        what = (f"a treatment ({low.treatment} / {high.treatment})" if low.treatment else
                "categorical: it sets " + ", ".join(p for p in low.sets if not _numeric(low.sets[p])) + " to values"
                " that are not numbers")
        return [f"{where} is {what} and has no midpoint for design.centre_points; hold it in the centre cells with"
                f" centre_level: 0 ({low.description}) or 1 ({high.description})"]
    problems = []
    low, high = factor.levels
    for path in low.sets:
        kind, a, b = midpoint_kind(factor, path), low.sets[path], high.sets[path]
        if kind == "geometric" and (a <= 0 or b <= 0):
            problems.append(f"{where}: the geometric midpoint of {path} needs both levels above 0 ({a} and {b}); set"
                            " midpoint: arithmetic")
            continue
        value = _midpoint(kind, a, b)
        if integer_field(root, path) and abs(value - round(value)) > 1e-9:
            other = "geometric" if kind == "arithmetic" else "arithmetic"
            alt = _midpoint(other, a, b) if other == "arithmetic" or (a > 0 and b > 0) else float("nan")
            hint = f"set midpoint: {other} ({_fmt(alt)}), " if math.isfinite(alt) and alt == round(alt) else ""
            problems.append(f"{where}: the {kind} midpoint of {path} between {a} and {b} is {_fmt(value)}, not a whole"
                            f" number, and the field takes integers; {hint}choose levels whose midpoint is whole, or"
                            " hold the factor with centre_level: 0 or 1")
    return problems


def centre_problems(config: ScreenConfig) -> list[str]:
    """Every centre-point declaration that cannot be run, one line each naming the field and the fix (whether the
    fields take the centre values, ScreenConfig checks by building the recipe: `centre_recipe_problem`)."""
    wanted = config.design.centre_points > 0
    problems = [p for f in config.design.factors for p in _factor_problems(type(config), f, wanted)]
    planted = [n for n in ("curvature", "leak_curvature") if config.simulated and getattr(config.simulation, n)]
    if not wanted:
        return problems + [f"simulation.{n}: curvature shows only in centre cells; set design.centre_points (2 or"
                           f" more) or drop simulation.{n}" for n in planted]
    if problems:
        return problems
    factors = config.design.factors
    if not any(centred(f) for f in factors):
        return ["design.centre_points: every factor is held (centre_level) or has no midpoint, so a centre cell would"
                " be a design cell; leave a numeric factor at its midpoint, or set centre_points: 0"]
    mid = {f.short for f in factors if centred(f)}
    for name in planted:
        for term in getattr(config.simulation, name):
                if term not in mid:
                    problems.append(f"simulation.{name}: {term!r} is not a factor the centre cells put at its midpoint"
                                    f" ({', '.join(sorted(mid))}); plant curvature on one of those")
    return problems


def centre_recipe_problem(sets: dict, refused: str) -> str:
    """The line for a centre recipe whose value a field refuses (the field's own message: `refused`)."""
    shown = ", ".join(f"{p}: {_fmt(v)}" for p, v in sets.items())
    return f"design.centre_points: the centre cells' recipe ({shown}) is refused: {refused}; give levels whose midpoint the field accepts"


def centre_recipe(config: ScreenConfig) -> list[tuple[str, str]]:
    """(factor, what the centre cells do with it) in declared order: the midpoint's values, or the held level."""
    out = []
    for f in config.design.factors:
        if centred(f):
            values = ", ".join(f"{p} {_fmt(v)}" for p, v in midpoint_sets(config, f).items())
            kinds = sorted({midpoint_kind(f, p) for p in f.paths})
            out.append((f"{f.short} ({f.label})", f"midpoint ({', '.join(kinds)}): {values}"))
        else:
            out.append((f"{f.short} ({f.label})", f"held at {f.centre_level}: {f.levels[f.centre_level].description}"))
    return out
