"""How many cells each phase of a screen runs, and how many each dispatch sends: the plan and the estimate both count
with these, so the two agree."""

from __future__ import annotations

from eps_screen import design
from eps_screen.config import ScreenConfig


def multiseed_count(config: ScreenConfig) -> int:
    """Phase-3 cells: each source's top cells (no more than its slab has) at each extra seed."""
    runs = len(design.phases(config).slab.runs())
    return len(config.sources) * min(config.seeds.top_k, runs) * len(config.seeds.multiseed)


def dispatch_groups(config: ScreenConfig, n_multi: int | None = None) -> list[int]:
    """Cells of each dispatch of a screen, as flows/screen.py sends them (the pre-screen is a job of its own): the
    smoke cells, the fold-over cells, each source's slab less the cells those two ran, the multi-seed cells
    (`n_multi` of them, multiseed_count by default)."""
    smoke, folded = design.smoke_cells(config), design.fold_over_cells(config)
    ran = {c.id for c in smoke + folded}
    slabs = [sum(c.id not in ran for c in design.slab_cells(config, source)) for source in config.sources]
    groups = [len(smoke), len(folded), *slabs, multiseed_count(config) if n_multi is None else n_multi]
    return [n for n in groups if n]
