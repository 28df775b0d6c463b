"""The tiers' marker policy, enforced while each test sets up and runs (docs/contributing.md, "Test tiers"):

- a test that trains (any torch optimizer step: LoRA cells, a tiny model's warm-up, a real screen) carries `slow`;
- a test that starts a server (a listening TCP socket, or a server or browser program in a subprocess: Prefect,
  Postgres, MLflow, moto, chromium, `eps-screen serve`) carries `integration`.

The rules hold in this process and, for servers, in the Python processes a test starts (tests/sitecustomize.py
installs the guards there from EPS_TEST_FORBID, which each launch passes on).

`make test` deselects both markers, so a test that breaks the policy fails here instead of slowing the fast tier.
Two exceptions, both shared set-up rather than what a test checks: the session's Prefect harness (tests/conftest.py)
is the one server the fast tier may start (flows on the simulated backend need it), and a tiny model's build
(eps_screen.models.tiny: a short warm-up, once per cache) may train wherever a test first loads the model. Module and
session fixtures are held to the markers of the test whose setup first builds them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess

import pytest

# What each marker allows; a test without the marker may do none of it.
TRAIN, SERVE = "slow", "integration"
# Programs that are servers or a browser, by the basename of argv[0] (or argv[1] after a launcher such as `prefect`).
SERVER_PROGRAMS = {"chromium", "chromium-browser", "chrome", "google-chrome", "postgres", "pg_ctl", "pg_ctlcluster",
                   "initdb", "moto_server", "uvicorn", "gunicorn", "mlflow"}
SERVER_COMMANDS = {("prefect", "server"), ("mlflow", "server"), ("eps-screen", "serve"), ("flows.cli", "serve")}
FORBID_ENV = "EPS_TEST_FORBID"
TESTS = os.path.dirname(os.path.abspath(__file__))

_forbidden: set[str] = set()  # the markers the running test lacks; empty between tests


class MarkerPolicyError(AssertionError):
    pass


def _refuse(marker: str, what: str) -> None:
    if marker in _forbidden:
        raise MarkerPolicyError(f"this test {what}: mark it @pytest.mark.{marker} (tests/marker_policy.py)")


@contextlib.contextmanager
def allowed(marker: str):
    """Lift one rule for a block: the session's Prefect harness, which the fast tier's flows run against."""
    held = marker in _forbidden
    _forbidden.discard(marker)
    try:
        yield
    finally:
        if held:
            _forbidden.add(marker)


def _optimizer_step(optimizer, args, kwargs):
    _refuse(TRAIN, f"trains (an optimizer step of {type(optimizer).__name__})")


_listen = socket.socket.listen


def _guarded_listen(self, *args):
    if self.family in (socket.AF_INET, socket.AF_INET6):  # not multiprocessing's AF_UNIX listeners
        _refuse(SERVE, f"starts a server (a TCP socket listens on {self.getsockname()})")
    return _listen(self, *args)


def server_program(argv) -> str | None:
    """The server or browser that a subprocess's argv starts, or None."""
    if isinstance(argv, (str, bytes, os.PathLike)):
        argv = [argv]
    words = [os.path.basename(os.fsdecode(a)) for a in list(argv)[:4]]
    if not words:
        return None
    if words[0] in SERVER_PROGRAMS and (words[0] != "mlflow" or words[1:2] == ["server"]):
        return words[0]
    for i in range(len(words) - 1):
        if (words[i], words[i + 1]) in SERVER_COMMANDS:
            return " ".join(words[i:i + 2])
    if len(words) >= 3 and words[1] == "-m" and words[2] in SERVER_PROGRAMS:  # python -m uvicorn
        return words[2]
    return None


_popen_init = subprocess.Popen.__init__


def _guarded_popen(self, args, *rest, **kwargs):
    program = server_program(args)
    if program:
        _refuse(SERVE, f"starts a server or browser in a subprocess ({program})")
    if _forbidden:  # the child's Python processes keep the rules (tests/sitecustomize.py)
        env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
        env[FORBID_ENV] = ",".join(sorted(_forbidden))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, env.get("PYTHONPATH")) if p)
        kwargs["env"] = env
    return _popen_init(self, args, *rest, **kwargs)


def guard_servers() -> None:
    socket.socket.listen = _guarded_listen
    subprocess.Popen.__init__ = _guarded_popen


def guard_child(markers: str) -> None:
    """In a process a test started: the test's missing markers, for servers (training here would need torch)."""
    _forbidden.update(m for m in markers.split(",") if m)
    guard_servers()


def _tiny_build_allowed(build):
    def tiny_build(*args, **kwargs):
        with allowed(TRAIN):
            return build(*args, **kwargs)

    return tiny_build


_installed = False


def pytest_configure(config) -> None:
    """Once per process (pytester's inner sessions configure again)."""
    global _installed
    if _installed:
        return
    _installed = True
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from eps_screen.models import tiny as tinymodel

    register_optimizer_step_pre_hook(_optimizer_step)
    guard_servers()
    tinymodel.build = _tiny_build_allowed(tinymodel.build)


@contextlib.contextmanager
def _held_to_markers(item):
    """The rules of the markers `item` lacks, for its set-up or its call (not teardown: a fixture may stop a server)."""
    _forbidden.update(m for m in (TRAIN, SERVE) if item.get_closest_marker(m) is None)
    try:
        yield
    finally:
        _forbidden.clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _held_to_markers(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _held_to_markers(item):
        return (yield)
