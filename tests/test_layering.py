"""The domain library never imports Prefect; tasks stay thin."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_import_eps_screen_does_not_import_prefect():
    code = "import sys, eps_screen, eps_screen.run.pipeline, eps_screen.run.aggregate; print('prefect' in sys.modules)"
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
        if mod.split(".")[0] in {"prefect", "flows", "tasks", "eps_screen_runpod"}
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


# -- the project's import graph ------------------------------------------------------------------------------------
# Where each top-level package of the project lives: the product's three beside the worker's distribution.
PACKAGES = {"eps_screen": ROOT / "eps_screen", "flows": ROOT / "flows", "tasks": ROOT / "tasks",
            "eps_screen_runpod": ROOT / "infra" / "eps_screen_runpod"}
MAX_LINES = 450


def _module_files(packages: dict[str, Path]) -> dict[str, Path]:
    """Module name -> file, for every .py file of the given packages (a package is named by its __init__.py)."""
    modules = {}
    for top, root in packages.items():
        for path in sorted(root.rglob("*.py")):
            parts = [top, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_imports(node: ast.AST):
    """Every import statement that runs when the module (or one of its functions) does: an import inside a function
    counts, one under `if TYPE_CHECKING:` does not (its else branch does)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            yield from _runtime_imports(ast.Module(body=child.orelse, type_ignores=[]))
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        yield from _runtime_imports(child)


def _import_graph(packages: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports. `from pkg import name` imports pkg.name when that is a module, else
    pkg; importing pkg.mod is an edge to pkg.mod only (its parent packages' __init__ files run too, but a package
    importing its own submodules is how a package re-exports, not a circle)."""
    modules = _module_files(packages)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:  # `import eps_screen.x.y` where y is a function, say
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """One circle per strongly connected component of more than one module (Tarjan), as a path a -> ... -> a,
    with every module of that component (more than the path when several circles share modules)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    circles = []
    for component in components:
        start = min(component)
        # Breadth-first from start, inside the component, back to start: the shortest circle through it.
        paths = {start: [start]}
        queue = [start]
        while queue:
            v = queue.pop(0)
            for w in sorted(graph[v] & component):
                if w == start:
                    circles.append(([*paths[v], start], sorted(component)))
                    queue = []
                    break
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    queue.append(w)
    return sorted(circles)


def test_the_circle_finder_finds_a_circle_and_ignores_type_checking_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text("from pkg import b\nA = 1\n")
    (pkg / "b.py").write_text("def f():\n    from .c import C\n    return C\n")  # inside a function: counts
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import f\n"
                              "else:\n    import pkg.a.A\nC = 1\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n")
    graph = _import_graph({"pkg": pkg})
    assert graph["pkg.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a"} and graph["pkg.d"] == set()
    assert _circles(graph) == [(["pkg.a", "pkg.b", "pkg.c", "pkg.a"], ["pkg.a", "pkg.b", "pkg.c"])]


def test_the_project_has_no_import_circle():
    graph = _import_graph(PACKAGES)
    assert "eps_screen.spec.config" in graph["flows.screen"] and "eps_screen_runpod.api" in graph["eps_screen_runpod.worker"]
    circles = _circles(graph)
    assert circles == [], "import circles (each must be cut, not hidden in a function):\n" + "\n".join(
        " -> ".join(path) + ("" if len(members) == len(path) - 1 else f"  (the knot: {', '.join(members)})")
        for path, members in circles)


def _decorated_with(path: Path, decorator: str) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                d = d.func if isinstance(d, ast.Call) else d
                if getattr(d, "id", None) == decorator or getattr(d, "attr", None) == decorator:  # flow, prefect.flow
                    return True
    return False


def test_a_flow_is_recognised_in_each_spelling_and_a_plain_module_is_not(tmp_path):
    spellings = {"a.py": "@flow\ndef f(): ...\n", "b.py": "@prefect.flow(name='x')\nasync def f(): ...\n",
                 "c.py": "def flow(): ...\n@task\ndef f(): ...\n"}
    for name, text in spellings.items():
        (tmp_path / name).write_text(text)
    assert [n for n in spellings if _decorated_with(tmp_path / n, "flow")] == ["a.py", "b.py"]


def test_every_module_in_flows_defines_a_flow_and_in_tasks_a_task():
    missing = [f"{path.relative_to(ROOT)} defines no @{decorator}"
               for folder, decorator in (("flows", "flow"), ("tasks", "task"))
               for path in sorted((ROOT / folder).glob("*.py"))
               if path.name != "__init__.py" and not _decorated_with(path, decorator)]
    assert missing == [], "\n".join(missing)


def test_no_module_of_the_prefect_wing_is_over_450_lines():
    lines = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for folder in ("flows", "tasks", "infra") for p in sorted((ROOT / folder).rglob("*.py"))}
    assert lines, "no module found"
    too_long = {path: n for path, n in lines.items() if n > MAX_LINES}
    assert too_long == {}, f"over {MAX_LINES} lines: {too_long}"
