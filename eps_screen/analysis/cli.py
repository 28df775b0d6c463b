"""The bodies of `eps-screen analyze-table` and `eps-screen design`, as plain functions.

Each returns (exit_code, text) and never raises for bad input: the CLI (flows/cli/) prints the text
and exits with the code. 0 = fine, 2 = bad input (one line saying what and where), the convention of
argparse and of the other commands.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from eps_screen.spec.centre_points import centre_recipe
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import (
    Cell,
    Fraction,
    all_slab_cells,
    level_symbol,
    multiseed_cells,
    phases,
    pick_top,
    smoke_cells,
)
from eps_screen.analysis.stats import DesignError, factorial_effects
from eps_screen.spec.plackett_burman import PlackettBurman

PHASES = ("smoke", "slab", "multiseed", "all")


def _error(message: str) -> tuple[int, str]:
    return 2, f"error: {message}"


# --------------------------------------------------------------------------- analyze-table


def read_table(file: str | Path) -> pl.DataFrame:
    """A CSV or parquet file as a DataFrame; DesignError (one line) for anything else."""
    path = Path(file)
    if not path.is_file():
        raise DesignError(f"{path}: no such file")
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            return pl.read_csv(path, infer_schema_length=None)
        if suffix in (".parquet", ".pq"):
            return pl.read_parquet(path)
    except Exception as err:  # polars raises several types for unreadable files; one line is what the user needs
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DesignError(f"{path}: cannot read as {suffix[1:]} ({first})") from None
    raise DesignError(f"{path}: unknown file type {suffix or '(none)'}; use .csv or .parquet")


def _factor_list(factors: str | Sequence[str] | None) -> list[str] | None:
    if factors is None:
        return None
    names = [f.strip() for f in factors.split(",")] if isinstance(factors, str) else [str(f).strip() for f in factors]
    if not names or any(not n for n in names):
        raise DesignError(f"--factors {','.join(names)!r}: give column names separated by commas, e.g. A,B,C")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise DesignError(f"--factors lists {', '.join(dupes)} more than once")
    return names


def analyze_table(file: str | Path, response: str, factors: str | Sequence[str] | None = None, as_json: bool = False) -> tuple[int, str]:
    """Main effects and two-factor interactions of `response` in a CSV/parquet table of a two-level design."""
    try:
        if not response or not str(response).strip():
            raise DesignError("--response needs a column name")
        table = read_table(file)
        effects = factorial_effects(table, str(response).strip(), _factor_list(factors))
    except DesignError as err:
        return _error(str(err))
    if as_json:
        return 0, json.dumps({"main_effects": effects.main_effects, "interactions": effects.interactions, "mean": effects.mean})
    return 0, _effects_text(effects)


def _effects_text(effects) -> str:
    width = max(len(k) for k in [*effects.main_effects, *effects.interactions, "term"])
    lines = [
        f"response: {effects.response}   runs: {effects.runs}   mean: {effects.mean:.6g}",
        "levels (low -> high): " + ", ".join(f"{f} {lo:g} -> {hi:g}" for f, (lo, hi) in effects.levels.items()),
        "",
        f"{'term':<{width}}  {'effect':>12}",
        f"{'-' * width}  {'-' * 12}",
    ]
    lines += [f"{k:<{width}}  {v:>12.6g}" for k, v in effects.main_effects.items()]
    if effects.interactions:
        lines.append(f"{'-' * width}  {'-' * 12}")
        lines += [f"{k:<{width}}  {v:>12.6g}" for k, v in effects.interactions.items()]
    lines += ["", "effect = mean(response at high) - mean(response at low); X:Y uses the product of the -1/+1 columns."]
    return "\n".join(lines)


# --------------------------------------------------------------------------- design


def _cell_rows(cells: Sequence[Cell]) -> list[dict]:
    return [c.as_dict() for c in cells]


def _cells_text(cells: Sequence[Cell]) -> list[str]:
    width = max((len(c.id) for c in cells), default=4)
    factors = cells[0].factors if cells else ""
    lines = [f"{'cell':<{width}}  source             seed  " + " ".join(factors)]
    lines += [f"{c.id:<{width}}  {c.source:<18} {c.seed:>4}  " + " ".join(map(level_symbol, c.levels)) for c in cells]
    return lines


def _fraction_data(frac: Fraction | PlackettBurman) -> dict:
    if isinstance(frac, PlackettBurman):
        return frac.alias_data()
    signed = [("-" if sign < 0 else "") + w for w, sign in frac.relation()]
    return {
        "design": frac.describe(),
        "generators": {g.factor: ("-" if g.sign < 0 else "") + g.word for g in frac.generators},
        "defining_relation": ["I", *signed] if signed else [],
        "resolution": frac.resolution,
        "aliases": frac.aliases(),
        "alias_chains": frac.alias_chains(),
    }


def _fraction_text(frac: Fraction | PlackettBurman) -> list[str]:
    """The textbook alias structure: generators, defining relation, resolution, and every alias chain."""
    if isinstance(frac, PlackettBurman):
        return frac.alias_text()
    if not frac.generators:
        return ["nothing is aliased: every effect is estimated on its own"]
    data = _fraction_data(frac)
    text = ["generators: " + ", ".join(f"{k} = {v}" for k, v in data["generators"].items()),
            "defining relation: " + " = ".join(data["defining_relation"]) + f" (resolution {frac.describe().rsplit(' ', 1)[-1]})",
            "alias structure (effects up to two factors):"]
    unaliased = "(not aliased with any main effect or two-factor interaction)"
    text += [f"  {k:<3} = {' = '.join(v) if v else unaliased}" for k, v in data["aliases"].items()]
    text += ["alias chains (every estimable contrast):", *("  " + " = ".join(chain) for chain in data["alias_chains"])]
    return text


def _smoke(config: ScreenConfig) -> tuple[dict, list[str]]:
    cells = smoke_cells(config)
    frac = phases(config).smoke
    data = {"cells": _cell_rows(cells), "count": len(cells), **_fraction_data(frac)}
    text = [f"smoke: the {frac.describe()} on {config.smoke}, {len(cells)} cells", *_cells_text(cells), "",
            *_fraction_text(frac)]
    return data, text


def _slab(config: ScreenConfig) -> tuple[dict, list[str]]:
    cells = all_slab_cells(config)
    frac = phases(config).slab
    data = {"cells": _cell_rows(cells), "count": len(cells), "sources": list(config.sources), **_fraction_data(frac)}
    centre = sum(c.is_centre for c in cells)
    text = [f"slab: the {frac.describe()} for each of {len(config.sources)} sources at seed {config.seeds.primary}, "
            f"{len(cells) - centre} cells" + (f", and {centre} centre cells" if centre else ""), *_cells_text(cells), "",
            *_fraction_text(frac)]
    if centre:
        recipe = centre_recipe(config)
        data["centre_points"] = {"per_source": config.design.centre_points, "recipe": dict(recipe)}
        text += ["", f"centre points: {config.design.centre_points} cells per source (level c: the midpoint), one recipe"
                     " at seeds from the primary on; the curvature test, never in the effects:",
                 *(f"  {f}: {what}" for f, what in recipe)]
    return data, text


def _multiseed(config: ScreenConfig, slab_rates: dict[str, float] | None) -> tuple[dict, list[str]]:
    s = config.seeds
    count = len(config.sources) * s.top_k * len(s.multiseed)
    rule = (f"the top {s.top_k} cells per source by source rate in the slab results, re-run at seeds "
            f"{', '.join(map(str, s.multiseed))}")
    if slab_rates is None:
        data = {"cells": None, "count": count, "rule": rule, "picked_from_results": False}
        text = [f"multiseed: {count} cells ({len(config.sources)} sources x {s.top_k} x {len(s.multiseed)} seeds): {rule}.",
                "The cells are picked from slab results, which are not given here; they are known once the slabs have run."]
        return data, text
    rates = {Cell.parse(k): v for k, v in slab_rates.items()}
    top = {src: pick_top(rates, src, s.top_k) for src in config.sources}
    cells = multiseed_cells(config, top)
    data = {"cells": _cell_rows(cells), "count": len(cells), "rule": rule, "picked_from_results": True}
    return data, [f"multiseed: {rule}; {len(cells)} cells", *_cells_text(cells)]


def design_listing(config: ScreenConfig, phase: str, as_json: bool = False, slab_rates: dict[str, float] | None = None) -> tuple[int, str]:
    """The cells of a phase with their factor levels (smoke: also generators and aliases).

    slab_rates: {slab cell id: source rate}, when slab results exist, to show the actual multi-seed pick.
    """
    if phase not in PHASES:
        return _error(f"--phase {phase!r} is not one of {', '.join(PHASES)}")
    builders = {"smoke": lambda: _smoke(config), "slab": lambda: _slab(config), "multiseed": lambda: _multiseed(config, slab_rates)}
    try:
        chosen = list(builders) if phase == "all" else [phase]
        built = {name: builders[name]() for name in chosen}
    except (ValueError, KeyError) as err:
        return _error(str(err))
    if as_json:
        payload = built[phase][0] if phase != "all" else {name: data for name, (data, _) in built.items()}
        return 0, json.dumps({"phase": phase, **payload}, indent=2)
    return 0, "\n\n".join("\n".join(text) for _, text in built.values())
