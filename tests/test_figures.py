"""The measured figures as data (eps_screen/plan/figures.json): each entry checked against its result file, and an
installed copy of eps-screen estimating as the checkout does."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig

import pytest

from eps_screen.plan.figures import RESULTS, entries, figure
from tests.conftest import CONFIGS, ROOT

# Figures taken from a result file by a rule the test below cannot walk to: each checked here by its own rule.
DERIVED = {
    "start/off-policy-process": lambda r: round(_child(r)["process_start_s"] - _child(r)["start_s"]
                                                + _child(r)["release_s"], 1),
    "start/base-aside": lambda r: round(r["rounds"][0]["to_host_s"] + r["rounds"][0]["back_s"], 1),
    "anchor/smollm2-h100/compile-warmup": lambda r: _compile_warmup(r),
}
# Figures whose result file holds their inputs, not the figure itself (rounded summaries, a size, a failure).
SUMMARISED = {"start/compile-warmup", "transformers-generate-oom/A1", "cpu-tiny/train", "cpu-tiny/generate",
              "shape/off-policy-measured"}


def _child(result: dict) -> dict:
    (child,) = [s for ref, s in result["engines"].items() if ref.endswith("off-policy")]
    return child


def _compile_warmup(compiled: dict) -> float:
    """The compiled pool's warm-up less the eager pool's (the eager stages' file beside it), plus its first A1
    stage's wall less its second's."""
    eager = json.loads((ROOT / RESULTS / entries()["anchor/smollm2-h100/stage-a1-eager"]["result"]).read_text())
    first, second = (r["stage_wall_s"] for r in compiled["runs"] if r["A"] == 1)
    return round(compiled["warm_s"]["4"] - eager["warm_s"]["4"] + first - second, 1)


def _walk(doc, path: list):
    for step in path:
        doc = next(r for r in doc if all(r.get(k) == v for k, v in step.items())) if isinstance(step, dict) else doc[step]
    return doc


def _result(e: dict) -> dict:
    return json.loads((ROOT / RESULTS / e["result"]).read_text())


def test_every_figure_names_what_it_is_and_where_it_came_from():
    for key, e in entries().items():
        assert e["what"] and e["unit"] and e["value"] > 0, key
        if e["result"] is None:  # assumed, or measured by hand: its note says so
            assert key.startswith(("assumed/", "anchor/")), key
            assert "assumed" in e["note"] or ("by hand" in e["note"] and "no result file" in e["note"]), key
            continue
        result = _result(e)
        env = result.get("environment") or {}
        gpu = result.get("gpu") or env.get("gpu") or result.get("device")
        card = gpu["name"] if isinstance(gpu, dict) else gpu
        assert card is None or str(card).endswith(e["card"]) or e["card"] in str(card), key
        assert e["command"], key
        if result.get("command") or env.get("command"):
            assert e["command"] == (result.get("command") or env.get("command")), key


def test_every_figure_is_the_value_its_result_file_holds():
    checked = set()
    for key, e in entries().items():
        if e["result"] is None or key in SUMMARISED:
            continue
        result = _result(e)
        if "at" in e:
            measured = _walk(result, e["at"])
            assert e["value"] in (round(measured), round(measured, 1)), key
        elif "ratio_of" in e:
            assert e["value"] == _walk(result, e["ratio_of"][0]) / _walk(result, e["ratio_of"][1]), key
        else:
            assert e["value"] == DERIVED[key](result), key
        checked.add(key)
    assert len(checked) >= 60
    # vLLM's figures say at which vocabulary they were measured, as their result files do
    for key, e in entries().items():
        if key.startswith("vllm/"):
            assert e["vocab"] == _result(e).get("vocab", "tinyvocab"), key


def test_result_files_of_the_figures_are_committed():
    for key, e in entries().items():
        if e["result"]:
            assert (ROOT / RESULTS / e["result"]).is_file(), key
    assert figure("start/vllm-warm").source == RESULTS + entries()["start/vllm-warm"]["result"]


@pytest.mark.slow
def test_an_installed_copy_prints_the_checkouts_estimate(tmp_path):
    """`pip install .` (into a directory, no dependencies) run from outside the checkout, with neither the checkout
    nor the shared venv's editable install of it on the path, prints the same validate output."""
    import shutil

    source, target = tmp_path / "source", tmp_path / "installed"  # built from a copy: no build/ left in the checkout
    for part in ("eps_screen", "flows", "tasks"):
        shutil.copytree(ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / part, source / part)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True, cwd=tmp_path)
    assert (target / "eps_screen" / "plan" / "figures.json").is_file()
    site = sysconfig.get_paths()["purelib"]
    config = str(CONFIGS / "qwen7b.yaml")
    run = ("import sys; sys.path[:0] = sys.argv[1:3]; del sys.argv[1:3]; import eps_screen;"
           " assert eps_screen.__file__.startswith(sys.path[0]), eps_screen.__file__;"
           " from flows.cli import main; sys.exit(main())")
    # -I -S: no PYTHONPATH, no cwd, and no site-packages .pth files (the editable finder lives in one)
    installed = subprocess.run([sys.executable, "-I", "-S", "-c", run, str(target), site, "validate", config],
                               capture_output=True, text=True, cwd=tmp_path)
    checkout = subprocess.run([sys.executable, "-I", "-S", "-c", run, str(ROOT), site, "validate", config],
                              capture_output=True, text=True, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr[-2000:]
    assert checkout.returncode == 0, checkout.stderr[-2000:]
    assert "estimate: 7.0 H200-hours" in installed.stdout
    assert installed.stdout == checkout.stdout


def _figures_in_force() -> list[list[str]]:
    """The rows of BENCHMARKS.md's "Figures in force" tables: [what, value, card, command, result files]."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    section = text.split("## Figures in force", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| what")]
    return [r for r in rows if len(r) == 5]


def test_benchmarks_figures_in_force_are_the_data_files():
    """Every number of a "Figures in force" row is a figure of figures.json from that row's result files, and every
    result file the estimate reads is in the table."""
    import re

    by_file: dict[str, set] = {}
    for e in entries().values():
        if e["result"]:
            v = e["value"]
            by_file.setdefault(e["result"], set()).update({round(v), round(v, 1), round(v, 2)})
    named = set()
    for what, value, card, command, files in _figures_in_force():
        row_files = re.findall(r"`([^`]+\.json)`", files)
        named.update(row_files)
        known = set().union(*(by_file.get(f, set()) for f in row_files))
        for number in re.findall(r"\d[\d,]*(?:\.\d+)?", value):
            n = float(number.replace(",", ""))
            assert n in known, f"BENCHMARKS.md: {what}: {number} is no figure of {', '.join(row_files)} in figures.json"
    assert set(by_file) <= named, f"result files missing from BENCHMARKS.md: {sorted(set(by_file) - named)}"
