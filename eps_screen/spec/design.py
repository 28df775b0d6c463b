"""Factors, cells, regimes and the designs of each phase, over the factors a config declares.

Levels are stored as 0/1; the coded value used for effects and generators is -1/+1 (0 -> -1). A factor is named
by one capital letter, so an effect term is a word of letters, always spelled alphabetically whatever order the
factors are declared in ("A", "BD", "ABCE"; the statistics' "B:D"), and a cell id
(<source>-A0B1C0-s42) is read without the config.

A centre cell (design.centre_points) has its numeric factors at their midpoint, level CENTRE, spelled "c" in its id
(librarian-AcBcC1-s43: A and B at their midpoints, C held at level 1; eps_screen/spec/centre_points.py).

A fraction is given by generators (D=AB: D's coded column is the product of A's and B's). Its defining relation
is every product of the generators' words (I = ABD = ACE = BCDE), its resolution the shortest word, and two
effects are aliased when their product is in the relation. `min_aberration` searches every set of generators for
a resolution: the fewest runs, then the smallest word-length pattern (the textbook minimum-aberration rule); at
k <= 8 there are at most a few hundred sets. pyDOE3's fracfact_opt does the same search but not within a given
fraction (the smoke phase is a fraction of the slab), hence this small code.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from eps_screen.spec.centre_points import CENTRE, centre_levels, midpoint_sets
from eps_screen.spec.treatments import ANSWERS, EVALUATION, MARKER_LETTER, Condition, applied

if TYPE_CHECKING:
    from eps_screen.spec.config import DesignConfig, ScreenConfig
    from eps_screen.spec.plackett_burman import PlackettBurman

MARKER_SHORTS = "ABCDE"  # the marker screen's factors (eps_screen/spec/treatments.py), the default of ScreenConfig
SEARCH_MAX_FACTORS = 10


class DesignError(ValueError):
    """A design that cannot be built, or a table that is not a two-level design (stats); the message names the field
    or column and the fix."""


def coded(level: int) -> int:
    return 2 * level - 1


def level_symbol(level) -> str:
    """A level as ids spell it: 0, 1, or c for CENTRE (or for a level a table left empty: a centre cell's)."""
    return "c" if level is None or level == CENTRE else str(level)


def word_of(letters) -> str:
    """An effect word in its one spelling, letters in alphabetical order whatever order the factors are declared
    in ("LR", never "RL"), as the statistics name terms ("L:R": prediction_rules.canonical_term)."""
    return "".join(sorted(letters))


def multiply(*words: str) -> str:
    """Product of effect words: letters that appear an odd number of times (x*x = I)."""
    letters = "".join(words)
    return word_of(f for f in set(letters) if letters.count(f) % 2 == 1)


ROMAN = {1: "I", 2: "II", 3: "III", 4: "IV", 5: "V", 6: "VI", 7: "VII", 8: "VIII", 9: "IX", 10: "X"}


@dataclass(frozen=True)
class Generator:
    factor: str
    word: str  # sorted letters
    sign: int = 1

    def __str__(self) -> str:
        return f"{self.factor}={'-' if self.sign < 0 else ''}{self.word}"


def parse_generator(text: str, shorts: str, where: str) -> Generator:
    m = re.fullmatch(r"\s*([A-Z])\s*=\s*(-?)\s*([A-Z]+)\s*", text)
    if m is None:
        raise DesignError(f"{where}: {text!r} is not a generator; write it as D=AB (or D=-AB)")
    factor, minus, word = m.groups()
    unknown = sorted({ch for ch in factor + word if ch not in shorts})
    if unknown:
        raise DesignError(f"{where}: generator {text!r} names {', '.join(unknown)}, which "
                          f"{'is' if len(unknown) == 1 else 'are'} not a declared factor (declared: "
                          f"{', '.join(shorts)}); use declared short names")
    if factor in word or len(set(word)) != len(word):
        raise DesignError(f"{where}: generator {text!r}: the word must name other factors, each once")
    return Generator(factor, word_of(word), -1 if minus else 1)


@dataclass(frozen=True)
class Fraction:
    """A two-level design over `factors` (short letters in order): the full factorial, or the fraction given by
    generators. A generator's word may name factors generated before it (the smoke fraction of a fractional slab)."""

    factors: str
    generators: tuple[Generator, ...] = ()

    def __post_init__(self):
        gen = [g.factor for g in self.generators]
        if len(set(gen)) != len(gen):
            raise DesignError(f"a factor is generated twice ({', '.join(map(str, self.generators))})")

    @property
    def k(self) -> int:
        return len(self.factors)

    @property
    def p(self) -> int:
        return len(self.generators)

    @property
    def base(self) -> str:
        generated = {g.factor for g in self.generators}
        return "".join(f for f in self.factors if f not in generated)

    @property
    def name(self) -> str:
        return f"2^{self.k}" if not self.p else f"2^({self.k}-{self.p})"

    def _order(self, word: str) -> tuple[int, tuple[int, ...]]:
        """Shorter words first, then by the declared positions of their letters (L, R, N, M before LR, LN, ...)."""
        return len(word), tuple(sorted(self.factors.index(f) for f in word))

    def effects(self, max_order: int | None = None) -> list[str]:
        """Every effect word up to `max_order` letters (all by default), in `_order`."""
        top = self.k if max_order is None else max_order
        return [word_of(c) for n in range(1, top + 1) for c in itertools.combinations(self.factors, n)]

    def runs(self) -> list[tuple[int, ...]]:
        """The runs in standard order of the base factors (the first changes fastest)."""
        out = []
        for base_run in full_factorial(len(self.base)):
            levels = dict(zip(self.base, base_run, strict=True))
            pending = list(self.generators)
            while pending:
                ready = [g for g in pending if all(f in levels for f in g.word)]
                if not ready:
                    raise DesignError(f"generators {', '.join(map(str, pending))} define each other in a circle")
                for g in ready:
                    levels[g.factor] = (g.sign * math.prod(coded(levels[f]) for f in g.word) + 1) // 2
                    pending.remove(g)
            out.append(tuple(levels[f] for f in self.factors))
        return out

    def relation(self) -> list[tuple[str, int]]:
        """The defining relation: every (word, sign) with I = sign * word, the generators' words first, then their
        products (the textbook's order: E=ABC, F=BCD give I = ABCE = BCDF = ADEF)."""
        gens = [(multiply(g.word, g.factor), g.sign) for g in self.generators]
        words: dict[str, int] = {}
        for r in range(1, len(gens) + 1):
            for combo in itertools.combinations(gens, r):
                words[multiply(*(w for w, _ in combo))] = math.prod(s for _, s in combo)
        return list(words.items())

    @property
    def resolution(self) -> int | None:
        """The length of the shortest word of the relation; None for the full factorial (nothing aliased)."""
        rel = self.relation()
        return min(len(w) for w, _ in rel) if rel else None

    def word_length_pattern(self) -> tuple[int, ...]:
        """(A3, A4, ..., Ak): words of each length from 3 on (minimum aberration minimises it from the left)."""
        lengths = [len(w) for w, _ in self.relation()]
        return tuple(lengths.count(n) for n in range(3, self.k + 1))

    def alias_chains(self) -> list[list[str]]:
        """Every effect in its alias chain (the 2^(k-p) - 1 estimable combinations), with its sign where the
        relation gives one: [["A", "BCE", "DEF", "ABCDF"], ...], each chain and the list ordered shortest first."""
        rel = self.relation()
        seen: set[str] = set()
        chains = []
        seen.update(w for w, _ in rel)  # aliased with the mean: not estimable
        for eff in self.effects():
            if eff in seen:
                continue
            members = [(eff, 1)] + [(multiply(eff, w), s) for w, s in rel]
            seen.update(m for m, _ in members)
            chains.append([("-" if s < 0 else "") + m for m, s in sorted(members, key=lambda ms: self._order(ms[0]))])
        return sorted(chains, key=lambda c: self._order(c[0].lstrip("-")))

    def aliases(self, max_order: int = 2) -> dict[str, list[str]]:
        """For each main effect and two-factor interaction, the other effects up to `max_order` aliased with it."""
        rel = [w for w, _ in self.relation()]
        return {e: sorted({multiply(e, w) for w in rel if len(multiply(e, w)) <= max_order}, key=self._order)
                for e in self.effects(2)}

    def describe(self) -> str:
        res = self.resolution
        gens = ", ".join(map(str, self.generators))
        return self.name + (f", {gens}, resolution {ROMAN.get(res, res)}" if gens else " (full factorial)")

    def render(self) -> list[str]:
        """The textbook alias structure: the design, its defining relation, resolution, and every alias chain."""
        lines = [f"{self.describe()}: {len(self.runs())} runs of {self.k} factors ({', '.join(self.factors)})"]
        if not self.generators:
            return [*lines, "nothing is aliased: every effect is estimated on its own"]
        lines.append("defining relation: I = " + " = ".join(("-" if s < 0 else "") + w for w, s in self.relation()))
        lines.append("alias structure:")
        lines += ["  " + " = ".join(chain) for chain in self.alias_chains()]
        return lines


def full_factorial(k: int = 5) -> list[tuple[int, ...]]:
    """All 2^k runs in standard order (first factor changes fastest)."""
    return [tuple(reversed(run)) for run in itertools.product((0, 1), repeat=k)]


def fraction(shorts: str, generators: list[str], where: str) -> Fraction:
    return Fraction(shorts, tuple(parse_generator(g, shorts, where) for g in generators))


def _candidate_words(base: str) -> list[str]:
    return [word_of(c) for n in range(2, len(base) + 1) for c in itertools.combinations(base, n)]


def min_aberration(within: Fraction, resolution: int) -> Fraction:
    """The fraction of `within` (the full factorial, or a fraction whose runs it must keep to) with the fewest runs
    of at least `resolution`, minimum aberration among those; ties go to the first in a fixed order (the last
    base factors generated, words shortest first), which for the marker five gives D=AB, E=AC."""
    if within.k > SEARCH_MAX_FACTORS:
        raise DesignError(f"a resolution search over {within.k} factors is too large; give generators instead")
    for extra in range(len(within.base) - 1, 0, -1):
        new, keep = within.base[-extra:], within.base[:-extra]
        best: Fraction | None = None
        for words in itertools.combinations(_candidate_words(keep), extra):
            cand = Fraction(within.factors, within.generators + tuple(Generator(f, w) for f, w in zip(new, words)))
            if (cand.resolution or math.inf) < resolution:
                continue
            if best is None or cand.word_length_pattern() < best.word_length_pattern():
                best = cand
        if best is not None:
            return best
    return within


def _check_resolution(frac: Fraction, where: str) -> None:
    res = frac.resolution
    if res is not None and res < 3:
        short = next(w for w, _ in frac.relation() if len(w) == res)
        raise DesignError(f"{where}: {', '.join(map(str, frac.generators))} give resolution {ROMAN[res]} (I = "
                          f"{short}: {' and '.join(short) if res == 2 else short} aliased as main effects); choose "
                          "generators whose words make every word of the relation 3 or more letters long, or ask for"
                          " resolution: 3")


@dataclass(frozen=True)
class PhaseDesigns:
    slab: Fraction | PlackettBurman
    smoke: Fraction | PlackettBurman
    fold_over: Fraction | PlackettBurman | None  # the smoke fraction with every level flipped, when design.fold_over


def phase_fractions(design: DesignConfig) -> PhaseDesigns:
    """The slab, smoke and fold-over fractions a design block declares; DesignError names the field and the fix."""
    if design.slab.plackett_burman is not None or design.smoke.plackett_burman is not None:
        return _plackett_burman_phases(design)
    return _phase_fractions(design.shorts, tuple(design.slab.generators), design.slab.resolution,
                            tuple(design.smoke.generators), design.smoke.resolution, design.fold_over)


@lru_cache(maxsize=64)
def _phase_fractions(shorts: str, slab_gens: tuple[str, ...], slab_res: int | None, smoke_gens: tuple[str, ...],
                     smoke_res: int | None, fold: bool) -> PhaseDesigns:
    full = Fraction(shorts)
    slab = fraction(shorts, list(slab_gens), "design.slab.generators")
    _check_resolution(slab, "design.slab.generators")
    if slab_res is not None:
        slab = _at_resolution(full, slab, slab_res, "design.slab")
    extra = fraction(shorts, list(smoke_gens), "design.smoke.generators")
    twice = sorted({g.factor for g in extra.generators} & {g.factor for g in slab.generators})
    if twice:
        raise DesignError(f"design.smoke.generators: {', '.join(twice)} already generated by design.slab; the smoke"
                          " lists only the generators it adds to the slab's")
    smoke = Fraction(shorts, slab.generators + extra.generators)
    smoke.runs()  # a circle of generators fails here
    _check_resolution(smoke, "design.smoke.generators")
    if smoke_res is not None:
        smoke = _at_resolution(slab, smoke, smoke_res, "design.smoke")
    folded = None
    if fold:
        folded = Fraction(shorts, tuple(Generator(g.factor, g.word, g.sign * (-1) ** (len(g.word) + 1))
                                        for g in smoke.generators))
        if not set(folded.runs()) <= set(slab.runs()):
            raise DesignError("design.fold_over: the smoke's fold-over runs are not all in the slab design (its relation"
                              " has words of odd length); use a full slab or one of even words, or drop fold_over")
    return PhaseDesigns(slab, smoke, folded)


def _plackett_burman_phases(design: DesignConfig) -> PhaseDesigns:
    """A Plackett-Burman slab is its own smoke (it has no regular sub-fraction); its fold-over lies outside it and
    adds its runs to the smoke source's."""
    from eps_screen.spec.plackett_burman import PlackettBurman, PlackettBurmanError

    slab, smoke = design.slab, design.smoke
    if smoke.plackett_burman is not None:
        raise DesignError("design.smoke.plackett_burman: a Plackett-Burman design is declared on the slab only"
                          " (design.slab.plackett_burman), and the smoke then runs it on the smoke source; drop it")
    if slab.generators or slab.resolution is not None:
        raise DesignError("design.slab: plackett_burman is a design of its own; drop generators and resolution, or"
                          " drop plackett_burman")
    if smoke.generators or (smoke.resolution or 3) > 3:
        raise DesignError("design.smoke: with design.slab.plackett_burman the smoke is the Plackett-Burman design"
                          " itself (resolution III), which has no smaller fraction; drop design.smoke")
    try:
        pb = PlackettBurman(design.shorts, slab.plackett_burman)
    except PlackettBurmanError as err:
        raise DesignError(str(err)) from None
    return PhaseDesigns(pb, pb, pb.fold_over() if design.fold_over else None)


def _at_resolution(within: Fraction, given: Fraction, resolution: int, where: str) -> Fraction:
    if given.generators != within.generators:  # generators given too: they must reach the resolution asked for
        if (given.resolution or math.inf) < resolution:
            raise DesignError(f"{where}: the generators give resolution {ROMAN[given.resolution]}, below the"
                              f" resolution {resolution} asked for; drop the generators or the resolution")
        return given
    return min_aberration(within, resolution)


# --- cells and regimes ------------------------------------------------------------------------------------


# The id a GPU job runs the pre-screen (phase 0: the base model, no adapter) under, next to real cell ids.
PRE_SCREEN_ID = "pre-screen"
_CELL_ID = re.compile(r"(?P<source>.+)-(?P<code>(?:[A-Z][01c])+)-s(?P<seed>\d+)")


def level_code(shorts: str, levels: tuple[int, ...]) -> str:
    return "".join(f"{f}{level_symbol(lvl)}" for f, lvl in zip(shorts, levels, strict=True))


@dataclass(frozen=True, order=True)
class Cell:
    """One recipe of the screen for one source persona at one seed; `levels` in the order of `factors`."""

    source: str
    levels: tuple[int, ...]
    seed: int
    factors: str = MARKER_SHORTS

    def __post_init__(self):
        if len(self.levels) != len(self.factors):
            raise ValueError(f"cell of {self.source}: {len(self.levels)} levels for the factors {self.factors}")

    @property
    def id(self) -> str:
        return f"{self.source}-{level_code(self.factors, self.levels)}-s{self.seed}"

    def level(self, factor: str) -> int:
        return self.levels[self.factors.index(factor)]

    @property
    def is_centre(self) -> bool:
        return CENTRE in self.levels

    @property
    def row_levels(self) -> dict[str, int | None]:
        """The levels as the answers table holds them (integer columns): a factor at its midpoint is left empty."""
        return {f: None if lvl == CENTRE else lvl for f, lvl in zip(self.factors, self.levels, strict=True)}

    def as_dict(self) -> dict:
        return {"cell_id": self.id, "source": self.source, "seed": self.seed, **self.row_levels}

    @classmethod
    def parse(cls, cell_id: str) -> Cell:
        match = _CELL_ID.fullmatch(cell_id)
        if match is None:
            raise ValueError(f"cell id {cell_id!r} is not <source>-<factor><level>...-s<seed> with levels 0/1 (c: a"
                             " centre cell's midpoint), e.g. librarian-A0B1C0D0E1-s42")
        code = match["code"]
        levels = tuple(CENTRE if code[i + 1] == "c" else int(code[i + 1]) for i in range(0, len(code), 2))
        return cls(match["source"], levels, int(match["seed"]), code[::2])


@dataclass(frozen=True, order=True)
class Regime:
    """What a cell's training answers depend on: the source, the seed, the levels of the factors that touch the
    answers, and the answer source (on- or off-policy), which the id spells out."""

    source: str
    levels: tuple[tuple[str, int], ...]  # (short, level) of the answer-touching factors other than the answer source
    seed: int
    off_policy: bool = False

    @property
    def id(self) -> str:
        code = "".join(f"{f}{level_symbol(lvl)}" for f, lvl in self.levels)
        return f"{self.source}{'-' + code if code else ''}-s{self.seed}-{'off' if self.off_policy else 'on'}"


@dataclass(frozen=True)
class Recipe:
    """A cell's (or regime's, or pre-screen condition's) resolved recipe: the config with its levels' settings
    applied, and the side of every built-in treatment. What data, training and evaluation read."""

    config: ScreenConfig
    condition: Condition


def recipe_at(config: ScreenConfig, levels: dict[str, int]) -> Recipe:
    """The recipe at these levels (by short name); factors not named stay at the config's own values, a factor at
    CENTRE takes its midpoint values."""
    sets: dict = {}
    names = []
    for f in config.design.factors:
        if f.short in levels and levels[f.short] == CENTRE:
            sets.update(midpoint_sets(config, f))
        elif f.short in levels:
            level = f.levels[levels[f.short]]
            sets.update(level.sets or {})
            names += [level.treatment] if level.treatment else []
    return Recipe(config.with_sets(sets), applied(Condition(), names))


def recipe(config: ScreenConfig, cell: Cell) -> Recipe:
    if cell.factors != config.design.shorts:
        raise ValueError(f"cell {cell.id} has the factors {cell.factors}; this screen declares"
                         f" {config.design.shorts}: name its cells as librarian-{level_code(config.design.shorts, (0,) * len(config.design.shorts))}-s42")
    return recipe_at(config, dict(zip(cell.factors, cell.levels)))


def _answer_factors(config: ScreenConfig) -> list:
    return [f for f in config.design.factors if ANSWERS in f.stages]


def _is_answer_source(factor) -> bool:
    return factor.aspect is not None and factor.aspect.field == "off_policy"


def regime_of(config: ScreenConfig, cell: Cell) -> Regime:
    levels, off = [], False
    for f in _answer_factors(config):
        lvl = cell.level(f.short)
        if _is_answer_source(f):
            off = f.levels[lvl].treatment == "off_policy"
        else:
            levels.append((f.short, lvl))
    return Regime(cell.source, tuple(levels), cell.seed, off)


def regime_levels(config: ScreenConfig, regime: Regime) -> dict[str, int]:
    """A regime's levels by short name, its answer source's factor included."""
    levels = dict(regime.levels)
    for f in config.design.factors:
        if _is_answer_source(f):
            levels[f.short] = next(i for i, lv in enumerate(f.levels) if (lv.treatment == "off_policy") == regime.off_policy)
    return levels


def regime_recipe(config: ScreenConfig, regime: Regime) -> Recipe:
    return recipe_at(config, regime_levels(config, regime))


def _marker_reading(levels: dict[str, int]) -> Condition:
    """The condition a cell id meant before factors were declared: A-E as the marker screen's five."""
    return Condition(**{MARKER_LETTER[f].field: bool(lv) for f, lv in levels.items() if f in MARKER_LETTER})


def key_treatments(config: ScreenConfig, levels: dict[str, int]) -> dict | None:
    """The treatment sides to hash into a store key beside the id, or None where the id's letters, read as the
    marker screen's, already say them (so the marker screen's keys did not change when factors became declared).
    `levels`: the cell's or regime's levels by short name (a regime's answer source as D when D is that factor)."""
    condition = recipe_at(config, levels).condition
    return None if condition == _marker_reading(levels) else dict(sorted(vars(condition).items()))


def pre_screen_conditions(config: ScreenConfig) -> list[dict[str, int]]:
    """The base model's evaluation conditions: every combination of the levels of the factors that touch
    evaluation (the marker screen: A x B x C, 8 conditions), the last changing fastest; other factors at level 0."""
    shorts = "".join(f.short for f in config.design.factors if EVALUATION in f.stages)
    return [dict(zip(shorts, run)) for run in itertools.product((0, 1), repeat=len(shorts))]


# --- the phases ------------------------------------------------------------------------------------------


def phases(config: ScreenConfig) -> PhaseDesigns:
    return phase_fractions(config.design)


def _cells(config: ScreenConfig, source: str, runs: list[tuple[int, ...]], seed: int) -> list[Cell]:
    return [Cell(source, run, seed, config.design.shorts) for run in runs]


def smoke_cells(config: ScreenConfig) -> list[Cell]:
    return _cells(config, config.smoke, phases(config).smoke.runs(), config.seeds.primary)


def fold_over_cells(config: ScreenConfig) -> list[Cell]:
    """The smoke fraction's fold-over, on the smoke source (empty unless design.fold_over)."""
    folded = phases(config).fold_over
    return _cells(config, config.smoke, folded.runs(), config.seeds.primary) if folded else []


def slab_cells(config: ScreenConfig, source: str) -> list[Cell]:
    return _cells(config, source, phases(config).slab.runs(), config.seeds.primary)


def centre_cells(config: ScreenConfig, source: str) -> list[Cell]:
    """design.centre_points cells of a source, replicate i at seed primary + i: one recipe, trained again."""
    if not config.design.centre_points:
        return []
    levels = centre_levels(config)
    return [Cell(source, levels, config.seeds.primary + i, config.design.shorts)
            for i in range(config.design.centre_points)]


def all_slab_cells(config: ScreenConfig) -> list[Cell]:
    """The slab phase: each source's design cells, then its centre cells (none unless design.centre_points)."""
    return [c for s in config.sources for c in slab_cells(config, s) + centre_cells(config, s)]


def multiseed_cells(config: ScreenConfig, top: dict[str, list[tuple[int, ...]]]) -> list[Cell]:
    """Re-runs of each source's top cells (levels given per source) at the extra seeds."""
    return [
        Cell(source, levels, seed, config.design.shorts)
        for source in config.sources
        for levels in top.get(source, [])[: config.seeds.top_k]
        for seed in config.seeds.multiseed
    ]


def pick_top(cell_rates: dict[Cell, float], source: str, k: int) -> list[tuple[int, ...]]:
    """The k highest-source-rate design cells of a source (a centre cell is no recipe of the design); ties broken by
    cell id so the pick is reproducible."""
    ranked = sorted((c for c in cell_rates if c.source == source and not c.is_centre), key=lambda c: (-cell_rates[c], c.id))
    return [c.levels for c in ranked[:k]]


def regimes(config: ScreenConfig, cells: list[Cell]) -> list[Regime]:
    """Distinct answer sets the cells need: cells whose answer-touching levels agree share one."""
    return sorted({regime_of(config, c) for c in cells})


def job_size(n: int, per_job: int, parallel: int, least: int = 1) -> int:
    """Cells per GPU job for n cells: at most `per_job`, but small enough that `parallel` GPUs all get work, unless
    that would leave a job fewer than `least` cells (each job pays a pod's start-up)."""
    return max(1, min(per_job, max(least, math.ceil(n / parallel))))


def group_jobs(config: ScreenConfig, cell_ids: list[str], per_job: int, parallel: int) -> list[tuple[str, ...]]:
    """Cells (and the pre-screen, first) in GPU jobs of job_size cells.

    Ordered by regime (the cells that train on the same answers side by side), so a job generates each of its
    regimes' answers once and its other cells of that regime reuse them. The off-policy regimes come first and
    together, so that fewer jobs start the off-policy model's engine, then by levels before source, so that a
    condition's cells of every source are side by side (short cells trained together fill a stage)."""

    def order(cell_id: str) -> tuple:
        if cell_id == PRE_SCREEN_ID:
            return ()
        r = regime_of(config, Cell.parse(cell_id))
        return not r.off_policy, r.levels, r.source, r.seed, cell_id

    ordered = sorted(cell_ids, key=order)
    size = job_size(len(ordered), per_job, parallel, config.execution.min_cells_per_job)
    return [tuple(ordered[i:i + size]) for i in range(0, len(ordered), size)]
