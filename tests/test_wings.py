"""eps_screen/ is in wings, each a concern, in an order: a module imports only from its own wing and the wings before
it, never back up (an import inside a function counts: it runs too). Tasks never import flows. The import graph and
the circle check are tests/test_layering.py's; docs/architecture.md says what each wing holds."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT
from tests.test_layering import PACKAGES, _import_graph

# Lowest first. panels: the data files; spec: what a screen is; models: what a model reference means and the model
# it loads; store: where results live; generation: answers from a model; train: an adapter from examples; plan: what
# a screen will run, cost and take, and what it cost; analysis: statistics and verdicts on finished cells; report:
# the page and its plots; run: a cell end to end and a screen's aggregation, what the flows call.
WINGS = ["panels", "spec", "models", "store", "generation", "train", "plan", "analysis", "report", "run"]


def _wing(module: str, top: str = "eps_screen") -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == top and len(parts) > 1 else None


def _upward(graph: dict[str, set[str]], wings: list[str], top: str = "eps_screen") -> list[str]:
    """Every import from a wing into a later one, as "importer -> imported (wing -> wing)"."""
    return sorted(
        f"{src} -> {dst} ({_wing(src, top)} -> {_wing(dst, top)})"
        for src, targets in graph.items() if _wing(src, top) in wings
        for dst in targets if _wing(dst, top) in wings and wings.index(_wing(dst, top)) > wings.index(_wing(src, top))
    )


def _outside_the_wings(package: Path, wings: list[str]) -> list[str]:
    """Modules of the package, and folders holding modules, that are in no wing (its __init__.py aside; a folder
    that holds only caches is what git leaves of a package moved away, and holds no module)."""
    return sorted(p.name for p in package.iterdir()
                  if (p.suffix == ".py" and p.name != "__init__.py")
                  or (p.is_dir() and p.name not in wings and any(p.rglob("*.py"))))


def test_the_checks_see_an_upward_import_a_lazy_one_and_a_module_outside_the_wings(tmp_path):
    pkg = tmp_path / "pkg"
    for wing in ("low", "high"):
        (pkg / wing).mkdir(parents=True)
        (pkg / wing / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "high" / "a.py").write_text("from pkg.low import b\n")  # down: allowed
    (pkg / "low" / "b.py").write_text("X = 1\n")
    (pkg / "low" / "c.py").write_text("def f():\n    from pkg.high.a import b\n    return b\n")  # up, lazily
    (pkg / "loose.py").write_text("")
    (pkg / "gone" / "__pycache__").mkdir(parents=True)  # what git leaves of a package moved away
    graph = _import_graph({"pkg": pkg})
    assert _upward(graph, ["low", "high"], "pkg") == ["pkg.low.c -> pkg.high.a (low -> high)"]
    assert _outside_the_wings(pkg, ["low", "high"]) == ["loose.py"]
    assert _outside_the_wings(pkg, ["low"]) == ["high", "loose.py"]


def test_every_module_of_eps_screen_lives_in_a_wing_and_every_wing_exists():
    package = ROOT / "eps_screen"
    assert _outside_the_wings(package, WINGS) == [], "modules or folders outside WINGS: place each in a wing"
    assert [w for w in WINGS if not (package / w / "__init__.py").is_file()] == []


def test_no_import_runs_back_up_the_wings():
    graph = _import_graph(PACKAGES)
    assert "eps_screen.spec.config" in graph["eps_screen.run.pipeline"]  # the graph holds the real edges
    upward = _upward(graph, WINGS)
    assert upward == [], ("imports that run back up the wings (move the piece down, or the importer up):\n"
                          + "\n".join(upward))


def test_tasks_never_import_flows():
    graph = _import_graph(PACKAGES)
    assert "eps_screen.run.pipeline" in graph["tasks.cells"]
    offenders = sorted(f"{src} -> {dst}" for src, targets in graph.items() if src.split(".")[0] == "tasks"
                       for dst in targets if dst.split(".")[0] == "flows")
    assert offenders == []
