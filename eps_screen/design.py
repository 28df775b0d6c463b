"""Factors, cells and the designs of each phase.

Levels are stored as 0/1; the coded value used for effects and generators is -1/+1 (0 -> -1).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

from eps_screen.config import FACTOR_NAMES, ScreenConfig

SMOKE_GENERATORS: dict[str, str] = {"D": "AB", "E": "AC"}


@dataclass(frozen=True, order=True)
class Regime:
    """What a cell's training answers depend on: the prompt condition, the seed and the answer source (D)."""

    source: str
    A: int
    B: int
    C: int
    seed: int
    off_policy: bool = False

    @property
    def id(self) -> str:
        return f"{self.source}-A{self.A}B{self.B}C{self.C}-s{self.seed}-{'off' if self.off_policy else 'on'}"


# The id a GPU job runs the pre-screen (phase 0: the base model, no adapter) under, next to real cell ids.
PRE_SCREEN_ID = "pre-screen"
_CELL_ID = re.compile(r"(?P<source>.+)-A(?P<A>[01])B(?P<B>[01])C(?P<C>[01])D(?P<D>[01])E(?P<E>[01])-s(?P<seed>\d+)")


@dataclass(frozen=True, order=True)
class Cell:
    source: str
    levels: tuple[int, int, int, int, int]
    seed: int

    @property
    def id(self) -> str:
        code = "".join(f"{f}{lvl}" for f, lvl in zip(FACTOR_NAMES, self.levels, strict=True))
        return f"{self.source}-{code}-s{self.seed}"

    def level(self, factor: str) -> int:
        return self.levels[FACTOR_NAMES.index(factor)]

    @property
    def regime(self) -> Regime:
        a, b, c, d, _ = self.levels
        return Regime(self.source, a, b, c, self.seed, off_policy=bool(d))

    @property
    def on_policy(self) -> bool:
        return self.level("D") == 0

    @property
    def whole_answer_loss(self) -> bool:
        return self.level("E") == 1

    def as_dict(self) -> dict:
        return {"cell_id": self.id, "source": self.source, "seed": self.seed, **dict(zip(FACTOR_NAMES, self.levels))}

    @classmethod
    def parse(cls, cell_id: str) -> Cell:
        match = _CELL_ID.fullmatch(cell_id)
        if match is None:
            raise ValueError(f"cell id {cell_id!r} is not <source>-A?B?C?D?E?-s<seed> with levels 0/1,"
                             " e.g. librarian-A0B1C0D0E1-s42")
        levels = tuple(int(match[f]) for f in FACTOR_NAMES)
        return cls(match["source"], levels, int(match["seed"]))  # type: ignore[arg-type]


def coded(level: int) -> int:
    return 2 * level - 1


def full_factorial(k: int = 5) -> list[tuple[int, ...]]:
    """All 2^k runs in standard order (first factor changes fastest)."""
    return [tuple(reversed(run)) for run in itertools.product((0, 1), repeat=k)]


def fractional_factorial(generators: dict[str, str] = SMOKE_GENERATORS) -> list[tuple[int, ...]]:
    """The 2^(5-p) fraction whose generated factors are products of base factors (coded units)."""
    base = [f for f in FACTOR_NAMES if f not in generators]
    runs = []
    for base_run in full_factorial(len(base)):
        levels = dict(zip(base, base_run, strict=True))
        for gen, word in generators.items():
            product = 1
            for f in word:
                product *= coded(levels[f])
            levels[gen] = (product + 1) // 2
        runs.append(tuple(levels[f] for f in FACTOR_NAMES))
    return runs


def _multiply(*words: str) -> str:
    """Product of effect words: letters that appear an odd number of times (x*x = I)."""
    letters = "".join(words)
    return "".join(sorted(f for f in set(letters) if letters.count(f) % 2 == 1))


def defining_relation(generators: dict[str, str] = SMOKE_GENERATORS) -> list[str]:
    """Every word equal to the identity, e.g. D=AB, E=AC -> ABD, ACE, BCDE."""
    gens = [_multiply(word, gen) for gen, word in generators.items()]
    words = set()
    for r in range(1, len(gens) + 1):
        for combo in itertools.combinations(gens, r):
            words.add(_multiply(*combo))
    return sorted(words, key=lambda w: (len(w), w))


def alias_structure(generators: dict[str, str] = SMOKE_GENERATORS) -> dict[str, list[str]]:
    """For each main effect and two-factor interaction, the other effects (up to order 2) it is aliased with."""
    relation = defining_relation(generators)
    effects = list(FACTOR_NAMES) + ["".join(p) for p in itertools.combinations(FACTOR_NAMES, 2)]
    aliases: dict[str, list[str]] = {}
    for eff in effects:
        aliased = sorted({_multiply(eff, w) for w in relation}, key=lambda w: (len(w), w))
        aliases[eff] = [a for a in aliased if len(a) <= 2]
    return aliases


def smoke_cells(config: ScreenConfig) -> list[Cell]:
    return [Cell(config.smoke, run, config.seeds.primary) for run in fractional_factorial()]  # type: ignore[arg-type]


def slab_cells(config: ScreenConfig, source: str) -> list[Cell]:
    return [Cell(source, run, config.seeds.primary) for run in full_factorial()]  # type: ignore[arg-type]


def all_slab_cells(config: ScreenConfig) -> list[Cell]:
    return [c for s in config.sources for c in slab_cells(config, s)]


def multiseed_cells(config: ScreenConfig, top: dict[str, list[tuple[int, ...]]]) -> list[Cell]:
    """Re-runs of each source's top cells (levels given per source) at the extra seeds."""
    return [
        Cell(source, levels, seed)  # type: ignore[arg-type]
        for source in config.sources
        for levels in top.get(source, [])[: config.seeds.top_k]
        for seed in config.seeds.multiseed
    ]


def pick_top(cell_rates: dict[Cell, float], source: str, k: int) -> list[tuple[int, ...]]:
    """The k highest-source-rate cells of a source; ties broken by cell id so the pick is reproducible."""
    ranked = sorted((c for c in cell_rates if c.source == source), key=lambda c: (-cell_rates[c], c.id))
    return [c.levels for c in ranked[:k]]


def regimes(cells: list[Cell]) -> list[Regime]:
    """Distinct answer sets the cells need: E never changes the answers, so both E levels share one."""
    return sorted({c.regime for c in cells})


def job_size(n: int, per_job: int, parallel: int) -> int:
    """Cells per GPU job for n cells: at most `per_job`, but small enough that `parallel` GPUs all get work."""
    return max(1, min(per_job, math.ceil(n / parallel)))


def group_jobs(cell_ids: list[str], per_job: int, parallel: int) -> list[tuple[str, ...]]:
    """Cells (and the pre-screen, first) in GPU jobs of job_size cells.

    Ordered by regime (the cells that train on the same answers side by side), so a job generates each of its
    regimes' answers once and its other cells of that regime reuse them."""
    ordered = sorted(cell_ids, key=lambda c: "" if c == PRE_SCREEN_ID else Cell.parse(c).regime.id)
    size = job_size(len(ordered), per_job, parallel)
    return [tuple(ordered[i:i + size]) for i in range(0, len(ordered), size)]
