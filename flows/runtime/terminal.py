"""The terminal progress of a screen that something else runs (this process's flow, or a worker's run): read
from its store, so it works whoever runs the cells."""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path

from eps_screen.run.pipeline import finished_pre_screen
from eps_screen.spec import design
from eps_screen.spec.config import ScreenConfig, is_tiny
from eps_screen.store.result_store import ResultStore


def finished_ids(store: ResultStore) -> set[str]:
    """The ids of the cells with a metrics.json (of any key): one listing, cheap enough to poll."""
    pattern = "cells/*/*/metrics.json"
    if store.remote:
        return {Path(p).parent.parent.name for p in store.remote.glob(f"{store.screen}/{pattern}")}
    return {p.parent.parent.name for p in store.dir.glob(pattern)}


def screen_phase(config: ScreenConfig, store: ResultStore, done: set[str], total: int) -> str:
    """The phase a running screen is in, from the store: the first whose work is not all there (`total`: the
    plan's distinct cells)."""
    if finished_pre_screen(config, store) is None:
        return "phase 0: pre-screen"
    smoke = [c.id for c in design.smoke_cells(config)]
    if not done.issuperset(smoke):
        return f"phase 1: smoke {len(done.intersection(smoke))}/{len(smoke)}"
    folded = [c.id for c in design.fold_over_cells(config)]
    if not done.issuperset(folded):
        return f"phase 1b: fold-over {len(done.intersection(folded))}/{len(folded)}"
    slab = [c.id for c in design.all_slab_cells(config)]
    if not done.issuperset(slab):
        return f"phase 2: slabs {len(done.intersection(slab))}/{len(slab)}"
    return "phase 3: multi-seed" if len(done) < total else "phase 4: aggregation"


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def prefect_console_handlers() -> list:
    """Prefect's console log handlers on every logger, once Prefect's logging is set up (at `import prefect`): each
    prints through a rich Console of its own, bound to the stream it found then, so its lines would land inside a
    live bar. None before Prefect's logging exists (importing its handlers here would not set it up)."""
    if "prefect.logging.handlers" not in sys.modules:
        return []
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                     if isinstance(lg, logging.Logger))]
    return list(dict.fromkeys(h for lg in loggers for h in lg.handlers if isinstance(h, PrefectConsoleHandler)))


class TerminalProgress:
    """A screen's progress read from its store while something else runs it: phase, cells finished of the plan's
    distinct cells (`total`), elapsed, and time left (the cells left at the pace of those finished since this
    started).

    On a terminal, a rich bar redrawn in place; otherwise (a pipe, a log file) one plain line whenever the phase
    or the count changes, and at least every `heartbeat_s`. The first line is printed at once."""

    def __init__(self, config: ScreenConfig, store: ResultStore, total: int, console, label: str,
                 poll_s: float = 2.0, heartbeat_s: float = 30.0):
        self.config, self.store, self.total = config, store, total
        self.console, self.label = console, label
        self.poll_s, self.heartbeat_s = poll_s, heartbeat_s
        self.live = console.is_terminal
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.started = time.monotonic()
        self.first: tuple[float, int] | None = None  # (when, count) at the first cell finished here
        self.last: tuple[float, int] = (self.started, -1)
        self.bar = None
        self.handlers: list[tuple] = []  # (Prefect console handler, its own console) while the bar is live
        self.printed, self.said = 0.0, [""]

    def _eta(self, now: float, done: int) -> str:
        if done >= self.total:
            return "0s"
        if self.first is None or done - self.first[1] < 1:
            return "?"
        pace = (self.last[0] - self.first[0]) / max(1, self.last[1] - self.first[1])
        return "~" + _duration(pace * (self.total - done))

    def state(self) -> tuple[str, int, str]:
        """(phase, cells done, time left), and the pace is updated."""
        ids = finished_ids(self.store)
        done, now = min(self.total, len(ids)), time.monotonic()
        if done != self.last[1]:
            if self.last[1] >= 0 and self.first is None:
                self.first = (now, done)
            self.last = (now, done)
        return screen_phase(self.config, self.store, ids, self.total), done, self._eta(now, done)

    def line(self) -> str:
        phase, done, eta = self.state()
        return f"{self.label}: {phase} | {done}/{self.total} cells | {_duration(time.monotonic() - self.started)} " \
               f"elapsed | time left {eta}"

    def _say(self, force: bool = False) -> None:
        """A plain line when the phase or the count changed since the last one, or the heartbeat is due."""
        text = self.line()
        head = text.split(" | ", 2)[:2]
        if force or head != self.said or time.monotonic() - self.printed >= self.heartbeat_s:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)
            self.printed, self.said = time.monotonic(), head

    def _poll(self) -> None:
        while not self.halt.wait(self.poll_s):
            try:
                if self.live:
                    phase, done, eta = self.state()
                    self.bar.update(self.task, completed=done, phase=phase, eta=eta)
                else:
                    self._say()
            except Exception as exc:  # a store read that fails now and then must not stop the screen
                self.console.print(f"(progress not read: {type(exc).__name__}: {exc})", markup=False)

    def __enter__(self):
        if is_tiny(self.config.model.base) and finished_pre_screen(self.config, self.store) is None:
            self.console.print(f"{self.label}: phase 0 runs the base model on the eval panel; a first run builds the "
                               "tiny model before it (1-2 min)", markup=False, highlight=False, soft_wrap=True)
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn(f"{self.label} {{task.fields[phase]}}"), BarColumn(bar_width=20),
                                MofNCompleteColumn(), TextColumn("cells"), TimeElapsedColumn(),
                                TextColumn("time left {task.fields[eta]}"), console=self.console, transient=False)
            phase, done, eta = self.state()
            self.task = self.bar.add_task(self.label, total=self.total, completed=done, phase=phase, eta=eta)
            self.route_prefect_logs()
            self.bar.start()
        else:
            self._say(force=True)
        self.thread.start()
        return self

    def route_prefect_logs(self) -> None:
        """While the bar is live, Prefect's log lines go through the bar's console: printed above the bar, whole,
        with no copy of the bar left behind. Called again once Prefect is imported: its handlers exist only then."""
        if not self.live:
            return
        known = {id(h) for h, _ in self.handlers}
        for handler in prefect_console_handlers():
            if id(handler) not in known:
                self.handlers.append((handler, handler.console))
                handler.console = self.console

    def __exit__(self, *exc) -> None:
        self.halt.set()
        self.thread.join()
        if self.live:
            phase, done, eta = self.state()
            self.bar.update(self.task, completed=done, phase=phase, eta=eta)
            self.bar.stop()
            for handler, own in self.handlers:
                handler.console = own
        else:
            self._say()
