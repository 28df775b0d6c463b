"""How many cells each phase of a screen runs, and how many each dispatch sends: the plan and the estimate both count
with these, so the two agree."""

from __future__ import annotations

from eps_screen import design
from eps_screen.config import ScreenConfig


def multiseed_count(config: ScreenConfig) -> int:
    """Phase-3 cells: each source's top cells (no more than its slab has) at each extra seed."""
    runs = len(design.phases(config).slab.runs())
    return len(config.sources) * min(config.seeds.top_k, runs) * len(config.seeds.multiseed)


def known_dispatches(config: ScreenConfig) -> list[list[design.Cell]]:
    """The cells of each dispatch known before any result, as flows/screen.py sends them: the smoke cells, the
    fold-over cells, every source's slab (one dispatch) less the cells those two ran. The multi-seed cells come
    from the slab's results."""
    smoke, folded = design.smoke_cells(config), design.fold_over_cells(config)
    ran = {c.id for c in smoke + folded}
    slab = [c for c in design.all_slab_cells(config) if c.id not in ran]
    return [d for d in (smoke, folded, slab) if d]


def dispatch_groups(config: ScreenConfig, n_multi: int | None = None) -> list[int]:
    """Cells of each dispatch of a screen (the pre-screen is a job of its own): known_dispatches', then the
    multi-seed cells (`n_multi` of them, multiseed_count by default)."""
    multi = multiseed_count(config) if n_multi is None else n_multi
    return [len(d) for d in known_dispatches(config)] + ([multi] if multi else [])
