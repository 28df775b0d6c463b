"""The domain library never imports Prefect; tasks stay thin."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.conftest import ROOT


def test_import_eps_screen_does_not_import_prefect():
    code = "import sys, eps_screen, eps_screen.pipeline, eps_screen.aggregate; print('prefect' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def _imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_no_module_of_eps_screen_imports_prefect_or_the_flows():
    offenders = [
        (str(p.relative_to(ROOT)), mod)
        for p in (ROOT / "eps_screen").rglob("*.py")
        for mod in _imports(p)
        if mod.split(".")[0] in {"prefect", "prefect_shell", "flows", "tasks", "eps_screen_runpod"}
    ]
    assert offenders == []


def test_tasks_are_thin():
    for path in (ROOT / "tasks").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and any(
                getattr(d, "id", getattr(getattr(d, "func", None), "id", None)) == "task" for d in node.decorator_list
            ):
                assert len(node.body) <= 8, f"{path.name}:{node.name} has {len(node.body)} statements"
