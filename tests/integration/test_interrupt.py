"""Ctrl-C and SIGTERM end an in-process screen the same way (issue 43, "The CLI at the edges"): one line saying how
many finished cells are kept and how to resume, exit 130 (Ctrl-C) or 143 (SIGTERM), no traceback, within seconds,
and the temporary Prefect server (no PREFECT_API_URL) stopped last; running the same command again resumes.

`eps-screen run` (simulated backend) runs on a pseudo-terminal whose Ctrl-C (\\x03) the line discipline turns into
SIGINT for the foreground process group, as a terminal does. SIGTERM is sent to the whole group, as `timeout` and
batch schedulers do. The CLI runs through tests/integration/counted_cells.py, which counts every cell computation
started and holds the 4th of each run forever, so each signal lands while a cell is in flight and the run cannot
finish first: the test waits for the store, not for a clock.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import requests

from tests.integration.conftest import ROOT, quiet_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

COUNTED_CELLS = Path(__file__).with_name("counted_cells.py")
LINE = re.compile(r"interrupted: (\d+) cells finished are kept; run the same command to resume")


def finished(store: Path) -> set[str]:
    return {p.parent.parent.name for p in store.glob("simulated/cells/*/*/metrics.json")}


def _controlling_terminal() -> None:
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def run_until(tmp_path: Path, finished_cells: int, how: str) -> tuple[int, str, float]:
    """`eps-screen run` on a pseudo-terminal, its 4th cell computation blocked, until `finished_cells` cells are in
    the store; then Ctrl-C (how="int") or SIGTERM to its process group (how="term"). Returns the exit code, what the
    terminal got and the seconds from the signal to the exit; computed-HOW.txt lists the cells it started."""
    store = tmp_path / "store"
    env = quiet_env(tmp_path / "home", CELL_COUNTER=str(tmp_path / f"computed-{how}.txt"), BLOCK_AFTER="3",
                    PYTHONPATH=str(ROOT))
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    proc = subprocess.Popen([sys.executable, str(COUNTED_CELLS), "run", str(ROOT / "deployments/configs/simulated.yaml"),
                             "--store", str(store)], stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT,
                            preexec_fn=_controlling_terminal)
    os.close(slave)
    out, sent, deadline = b"", None, time.monotonic() + 600
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 1 << 16)
                except OSError:  # the terminal closed: every process on it has exited
                    chunk = b""
                out += chunk
                if not chunk:
                    break
            if sent is None and len(finished(store)) >= finished_cells:
                sent = time.monotonic()
                if how == "int":
                    os.write(master, b"\x03")
                else:
                    os.killpg(proc.pid, signal.SIGTERM)
            assert sent is not None or proc.poll() is None, out.decode(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "no cell finished, or the run did not end"
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        os.close(master)
    return code, out.decode(errors="replace"), time.monotonic() - sent


def check_ending(code: int, text: str, took: float, expect_code: int, kept: int) -> None:
    assert code == expect_code, text[-3000:]
    assert "Traceback" not in text and "Error logging to API" not in text, text[-3000:]
    assert [int(n) for n in LINE.findall(text)] == [kept], text[-3000:]
    assert took < 45, f"the run took {took:.0f} s to end after the signal"
    # The temporary server ran in a session of its own and was stopped by the run itself, last.
    port = re.search(r"Starting temporary server on http://127\.0\.0\.1:(\d+)", text).group(1)
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/api/health", timeout=5)
    # Prefect's log lines went above the live bar: none is glued to a stale copy of it.
    assert not re.findall(r"time left \S+?\d\d:\d\d:\d\d\.\d{3} \|", text)


def test_ctrl_c_then_sigterm_end_the_run_in_one_line_and_the_same_command_resumes(tmp_path):
    code, text, took = run_until(tmp_path, finished_cells=3, how="int")
    check_ending(code, text, took, expect_code=130, kept=3)
    first = finished(tmp_path / "store")
    assert len(first) == 3

    code, text, took = run_until(tmp_path, finished_cells=6, how="term")
    check_ending(code, text, took, expect_code=143, kept=6)
    again = (tmp_path / "computed-term.txt").read_text().split()
    assert not set(again) & first  # the finished cells were kept, not computed again
    assert finished(tmp_path / "store") - first <= set(again)
    print(f"Ctrl-C and SIGTERM each ended the run; the SIGTERM'd run exited {took:.1f} s after the signal")
