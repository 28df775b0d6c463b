"""The marker policy (tests/marker_policy.py) fails a test that trains without `slow` or starts a server without
`integration`, and passes the same test once it carries its marker: each case is run by an inner pytest."""

from __future__ import annotations

import textwrap

import pytest

from marker_policy import TESTS, server_program

# The inner session loads the policy as tests/conftest.py does, in a process of its own (pytester's in-process runs
# drop the modules they import, and torch's native ones cannot be imported twice).
CONFTEST = f"import sys\nsys.path.insert(0, {TESTS!r})\npytest_plugins = ['marker_policy']\n"

CASES = {
    "trains": ("slow", """
        import torch
        w = torch.nn.Parameter(torch.ones(2))
        opt = torch.optim.AdamW([w], lr=0.1)
        (w ** 2).sum().backward()
        opt.step()
    """),
    "listens": ("integration", """
        from http.server import HTTPServer, BaseHTTPRequestHandler
        HTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler).server_close()
    """),
    "serves from a child process": ("integration", """
        import subprocess, sys
        serve = "import http.server as h; h.HTTPServer(('127.0.0.1', 0), h.BaseHTTPRequestHandler).server_close()"
        child = subprocess.run([sys.executable, "-c", serve], capture_output=True, text=True)
        assert child.returncode == 0, child.stderr
    """),
    "starts chromium": ("integration", """
        import subprocess
        try:  # a path that does not exist: the policy speaks before the launch would fail
            subprocess.Popen(["/nonexistent/chromium", "--headless"])
        except FileNotFoundError:
            pass
    """),
}


def _body(code: str) -> str:
    return textwrap.indent(textwrap.dedent(code).strip(), "    ")


@pytest.mark.parametrize("case", list(CASES))
def test_an_unmarked_test_that_trains_or_serves_fails_and_passes_marked(pytester, case):
    marker, code = CASES[case]
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(f"""
import pytest

def test_unmarked():
{_body(code)}

@pytest.mark.{marker}
def test_marked():
{_body(code)}

def test_quiet():
    sum(range(10))
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([f"*mark it @pytest.mark.{marker}*", "FAILED *::test_unmarked*"])


def test_a_module_fixture_is_held_to_the_first_test_it_serves(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile("""
import pytest
from http.server import HTTPServer, BaseHTTPRequestHandler

@pytest.fixture(scope="module")
def server():
    s = HTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    yield s
    s.server_close()

def test_unmarked(server):
    pass
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*mark it @pytest.mark.integration*", "ERROR *::test_unmarked*"])


@pytest.mark.parametrize("argv, program", [
    (["/usr/bin/chromium", "--headless"], "chromium"),
    (["/venv/bin/prefect", "server", "start"], "prefect server"),
    (["/venv/bin/python", "-m", "uvicorn", "app"], "uvicorn"),
    (["/usr/lib/postgresql/15/bin/initdb", "-D", "x"], "initdb"),
    (["/venv/bin/mlflow", "server"], "mlflow"),
    (["/venv/bin/prefect", "worker", "start"], None),
    (["/venv/bin/python", "-m", "flows.cli", "serve", "--port", "0"], "flows.cli serve"),
    (["/venv/bin/eps-screen", "--help"], None),
    (["/venv/bin/python", "-c", "print(1)"], None),
    ("git", None),
])
def test_server_programs_are_told_from_other_subprocesses(argv, program):
    assert server_program(argv) == program



def test_a_tiny_models_build_may_train_in_an_unmarked_test_and_nothing_else_may():
    import torch

    from eps_screen.models import tiny as tinymodel
    from marker_policy import MarkerPolicyError, _tiny_build_allowed

    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)

    def warm_up():
        (w ** 2).sum().backward()
        opt.step()

    assert tinymodel.build.__name__ == "tiny_build"  # the policy's wrapper, installed at configure
    _tiny_build_allowed(warm_up)()
    with pytest.raises(MarkerPolicyError, match="mark it @pytest.mark.slow"):
        warm_up()
