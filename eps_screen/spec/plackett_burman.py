"""Plackett-Burman designs: k two-level factors (k <= N-1) in N runs, N = 12, 20 or 24 (`slab: {plackett_burman: 12}`).

The design is Plackett & Burman's (1946) cyclic construction, as Montgomery's Design and Analysis of Experiments
tabulates it: the first run is the generator row below, each further run shifts the previous one right by one
(the last sign moves to the front), and the last run has every factor low; the factors take the first k columns.
Three rows of signs are clearer than a dependency: pyDOE3's pbdesign builds a Hadamard matrix of another form.

Unlike a 2^(k-p) fraction, a Plackett-Burman design has no defining relation: no effect is the exact alias of
another, but each main effect is *partially* aliased with every two-factor interaction of two other factors. Its
expected estimate is the effect plus c times each such interaction's, c their columns' correlation (the alias
matrix of an orthogonal design): +-1/3 in the 12-run design, for each of the 45 interactions of two of the other
10 factors. A large interaction therefore leaks a third of itself into up to nine main effects. Running the design
again with every level flipped (`design.fold_over`) makes every main effect orthogonal to every two-factor
interaction, as for a fraction.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction as Ratio
from functools import cached_property

import numpy as np

SIGNS = {  # Plackett & Burman (1946), the first run of each design; "+" is the high level
    12: "++-+++---+-",
    20: "++--++++-+-+----++-",
    24: "+++++-+-++--++--+-+----",
}
SIZES = tuple(SIGNS)


class PlackettBurmanError(ValueError):
    """A Plackett-Burman declaration that cannot be built; the message names the field and the fix."""


def matrix(n: int) -> np.ndarray:
    """The n x (n-1) design in coded levels (-1/+1), runs in the cyclic order above."""
    first = np.array([1 if c == "+" else -1 for c in SIGNS[n]])
    rows = [np.roll(first, shift) for shift in range(n - 1)]
    return np.vstack([*rows, -np.ones(n - 1, dtype=int)])


def check_size(n: int, k: int, where: str = "design.slab.plackett_burman") -> None:
    if n not in SIGNS:
        raise PlackettBurmanError(
            f"{where}: {n} is not a Plackett-Burman size offered; use 12, 20 or 24 (8, 16 and 32 runs"
            " are the regular fractions: give generators or a resolution instead)")
    if k > n - 1:
        bigger = [s for s in SIZES if s - 1 >= k]
        fix = f"use plackett_burman: {bigger[0]}" if bigger else "use a 2^(k-p) fraction (generators or a resolution)"
        raise PlackettBurmanError(f"{where}: {n} runs hold at most {n - 1} factors and {k} are declared; {fix}")


def ratio(value: float, runs: int) -> str:
    """A correlation as the signed fraction it is in an N-run design (+1/3, -3/5)."""
    r = Ratio(value).limit_denominator(runs)
    return f"{'+' if r > 0 else '-'}{abs(r)}" if r else "0"


@dataclass(frozen=True)
class PlackettBurman:
    """A Plackett-Burman design over `factors` (short letters in order); `folded`: every level flipped (the
    fold-over), which with the design itself makes the main effects orthogonal to the two-factor interactions."""

    factors: str
    n: int
    folded: bool = False

    def __post_init__(self):
        check_size(self.n, len(self.factors))

    @property
    def k(self) -> int:
        return len(self.factors)

    @property
    def name(self) -> str:
        return f"PB{self.n}"

    @cached_property
    def coded(self) -> np.ndarray:
        m = matrix(self.n)[:, : self.k]
        return -m if self.folded else m

    def runs(self) -> list[tuple[int, ...]]:
        return [tuple(int(x > 0) for x in row) for row in self.coded]

    def describe(self) -> str:
        return f"Plackett-Burman PB{self.n} of {self.k} factors" + (
            ", every level flipped (fold-over)" if self.folded else ", resolution III")

    def relation(self) -> list[tuple[str, int]]:
        return []  # no defining relation: nothing is an exact alias of anything

    def aliases(self, max_order: int = 2) -> dict[str, list[str]]:
        """Exact aliases, as Fraction.aliases gives them: none among the main effects and two-factor interactions
        that are not also partial (a correlation of +-1 would be one); see partial_aliases."""
        exact = {}
        for e in self._effects():
            exact[e] = [o for o in self._effects() if o != e and abs(self._corr(e, o)) == 1 and len(o) <= max_order]
        return exact

    def partial_aliases(self) -> dict[str, list[tuple[str, float]]]:
        """For each main effect, every two-factor interaction correlated with it, with the correlation (the alias
        coefficient: the main effect's estimate carries that share of the interaction)."""
        out = {}
        for f in self.factors:
            pairs = [a + b for a, b in itertools.combinations(self.factors, 2)]
            out[f] = [(w, c) for w in pairs if abs(c := self._corr(f, w)) > 1e-9]
        return out

    def correlations(self) -> set[str]:
        """The distinct |correlations| of a main effect with a two-factor interaction, as fractions (PB12: {1/3})."""
        return {ratio(abs(c), self.n).lstrip("+") for pairs in self.partial_aliases().values() for _, c in pairs}

    def _effects(self) -> list[str]:
        return [*self.factors, *(a + b for a, b in itertools.combinations(self.factors, 2))]

    def _column(self, word: str) -> np.ndarray:
        return np.prod(self.coded[:, [self.factors.index(f) for f in word]], axis=1)

    def _corr(self, a: str, b: str) -> float:
        return float(self._column(a) @ self._column(b)) / self.n

    def fold_over(self) -> PlackettBurman:
        return PlackettBurman(self.factors, self.n, not self.folded)

    def alias_data(self) -> dict:
        """What `eps-screen design --json` gives for a fraction, and the partial-alias table."""
        return {
            "design": self.describe(), "generators": {}, "defining_relation": [], "resolution": 3,
            "aliases": self.aliases(), "alias_chains": [],
            "partial_aliases": {f: {":".join(w): ratio(c, self.n) for w, c in pairs}
                                for f, pairs in self.partial_aliases().items()},
        }

    def alias_text(self) -> list[str]:
        """The partial-alias table: each main effect with the two-factor interactions it carries a share of."""
        if self.folded:
            return ["every main effect is partially aliased with two-factor interactions, as in the design it folds"]
        corr = " or ".join(sorted(self.correlations()))
        lines = [f"no defining relation: no effect is an exact alias of another, but each main effect is partially "
                 f"aliased with two-factor interactions (correlation {corr}): its estimate carries that share of each",
                 "partial aliases (main effect: two-factor interaction with its correlation):"]
        for f, pairs in self.partial_aliases().items():
            lines.append(f"  {f}: " + ", ".join(f"{ratio(c, self.n)} {':'.join(w)}" for w, c in pairs))
        lines.append("a fold-over (design.fold_over: true) de-aliases the main effects from every two-factor interaction")
        return lines
