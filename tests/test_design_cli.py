"""`eps-screen design` as a user runs it: the textbook alias structure of the shipped 2^(6-2)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import CONFIGS, ROOT


def _design(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", "design", *args], check=False, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_the_2_6_2_by_generators_prints_its_textbook_alias_structure():
    """E = ABC, F = BCD: resolution IV, I = ABCE = BCDF = ADEF (Box, Hunter & Hunter); main effects clear of
    two-factor interactions, which are aliased in pairs (AB = CE) and one triple (AE = BC = DF)."""
    out = _design(str(CONFIGS / "sim-6-2.yaml"), "--phase", "slab")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "slab: the 2^(6-2), E=ABC, F=BCD, resolution IV for each of 3 sources" in text
    assert "generators: E = ABC, F = BCD" in text
    assert "defining relation: I = ABCE = BCDF = ADEF (resolution IV)" in text
    assert "  A   = (not aliased with any main effect or two-factor interaction)" in text
    assert "  AB  = CE\n" in text and "  AE  = BC = DF\n" in text
    assert "  A = BCE = DEF = ABCDF\n" in text
    chains = text.split("alias chains (every estimable contrast):\n", 1)[1].strip().splitlines()
    assert len(chains) == 15  # 16 runs: 15 estimable contrasts besides the mean
    header = next(line for line in text.splitlines() if line.startswith("cell "))
    assert header.split()[-6:] == list("ABCDEF")  # the declared factors, in the config's order


def test_json_gives_the_relation_and_every_phase():
    out = _design(str(CONFIGS / "sim-6-2.yaml"), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    slab, smoke = data["slab"], data["smoke"]
    assert slab["defining_relation"] == ["I", "ABCE", "BCDF", "ADEF"] and slab["resolution"] == 4
    assert slab["count"] == 3 * 16 and smoke["count"] == 8 and smoke["resolution"] == 3
    assert {c["cell_id"] for c in smoke["cells"]} <= {c["cell_id"] for c in slab["cells"]}  # a fraction of the slab


def test_a_bad_config_is_one_line_on_stderr(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((CONFIGS / "sim-6-2.yaml").read_text().replace("[E=ABC, F=BCD]", "[E=ABC, F=BCX]"))
    out = _design(str(bad))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "F=BCX" in out.stderr and "X, which is not a declared factor" in out.stderr


def test_a_fold_over_is_listed_with_what_smoke_and_fold_over_give_together(tmp_path):
    """tiny.yaml's smoke D=AB, E=AC (I = ABD = ACE = BCDE), folded over: D=-AB, E=-AC; together the 2^(5-1) with
    I = BCDE, resolution IV."""
    path = tmp_path / "fold.yaml"
    path.write_text((CONFIGS / "tiny.yaml").read_text().replace("  smoke: {generators: [D=AB, E=AC]}",
                                                                "  fold_over: true\n  smoke: {generators: [D=AB, E=AC]}"))
    out = _design(str(path), "--phase", "smoke")
    assert out.returncode == 0, out.stderr
    assert "fold-over: the smoke fraction with every level flipped, 2^(5-2), D=-AB, E=-AC, resolution III, on " \
           "librarian, 8 cells" in out.stdout
    assert "smoke and fold-over together: 16 runs, I = BCDE (resolution IV)" in out.stdout
    data = json.loads(_design(str(path), "--json").stdout)
    smoke = {tuple(c[f] for f in "ABCDE") for c in data["smoke"]["cells"]}
    folded = {tuple(c[f] for f in "ABCDE") for c in data["fold_over"]["cells"]}
    assert folded == {tuple(1 - x for x in run) for run in smoke} and not folded & smoke
    assert data["fold_over"]["with_smoke"] == {"runs": 16, "defining_relation": ["I", "BCDE"], "resolution": 4}
    plain = _design(str(CONFIGS / "tiny.yaml"), "--json")
    assert "fold_over" not in json.loads(plain.stdout)  # only where declared
