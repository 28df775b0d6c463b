"""A fresh clone's README, docs and config comments refer only to files that are in the repository.

Checked in README.md, docs/*.md and the comment lines of deployments/configs/*.yaml:
- markdown links `[text](target)` with a relative target: the file exists (inside the repository) and, for an
  anchor into a markdown file, the heading exists;
- any `../` path (e.g. `../shared/SPEC.md`, outside the repository): never allowed;
- a path that starts with a top-level entry of the repository (`docs/...`, `eps_screen/...`): it exists;
- a markdown file named on its own (`BENCHMARKS.md`): it exists beside the referring file or at the root.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
OUTSIDE = re.compile(r"(?<![\w.])\.\./[\w./-]*")
PATHLIKE = re.compile(r"(?<![\w./:-])((?:[\w.-]+/)+[\w.-]*\w)")
MD_NAME = re.compile(r"(?<![\w./-])([\w-]+\.md)\b")
EXTERNAL = ("http://", "https://", "mailto:", "s3://", "file://")


def _doc_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "deployments" / "configs").glob("*.yaml"))]


def _text(path: Path) -> str:
    """Markdown whole; YAML only its comments (whole-line and trailing)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".yaml":
        return text
    comments = []
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("#"):
            comments.append(stripped)
        elif " #" in line:
            comments.append(line[line.index(" #") + 1:])
    return "\n".join(comments)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", path.read_text(encoding="utf-8"), re.M)}


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def _generated(root: Path) -> set[str]:
    """Top-level entries the repository ignores (test-output/, results/, build/): a run writes them, so a reference
    into one is not checked, whether or not an earlier test happened to create it."""
    ignore = root / ".gitignore"
    lines = ignore.read_text().splitlines() if ignore.exists() else []
    return {line.strip().strip("/") for line in lines if line.strip() and not any(c in line for c in "*#!")}


def broken_references(path: Path, text: str, root: Path = ROOT) -> list[str]:
    """Every reference in `text` (the content of `path`) to a relative path that is not in the repository at `root`."""
    problems = []
    here = path.parent
    top = {p.name for p in root.iterdir() if not p.name.startswith(".git")} - _generated(root)

    for m in LINK.finditer(text):
        target = m.group(1)
        if target.startswith(EXTERNAL) or target.startswith("#"):
            if target.startswith("#") and path.suffix == ".md" and target[1:] not in _anchors(path):
                problems.append(f"link {target}: no such heading in {path.name}")
            continue
        file_part, _, anchor = target.partition("#")
        dest = (here / file_part).resolve()
        if not _inside(dest, root):
            problems.append(f"link {target}: outside the repository")
        elif not dest.exists():
            problems.append(f"link {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            problems.append(f"link {target}: no heading #{anchor} in {file_part}")

    for m in OUTSIDE.finditer(text):
        dest = (here / m.group(0)).resolve()
        if not _inside(dest, root) or not dest.exists():
            problems.append(f"path {m.group(0)}: not in the repository")

    for m in PATHLIKE.finditer(text):
        ref = m.group(1)
        first = ref.split("/")[0]
        if first not in top or any(ch in ref for ch in "*<>{}"):
            continue  # not a repository path (an artifact inside a store, a URL's tail, a pattern)
        if not (root / ref).exists():
            problems.append(f"path {ref}: no such file or directory")

    for m in MD_NAME.finditer(text):
        name = m.group(1)
        if not ((here / name).exists() or (root / name).exists()):
            problems.append(f"{name}: no such file beside {path.name} or at the repository root")
    return problems


@pytest.mark.parametrize("path", _doc_files(ROOT), ids=lambda p: str(p.relative_to(ROOT)))
def test_references_exist(path: Path) -> None:
    problems = broken_references(path, _text(path))
    assert not problems, f"{path.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_docs_are_found() -> None:
    names = {str(p.relative_to(ROOT)) for p in _doc_files(ROOT)}
    assert {"README.md", "docs/experiment.md", "deployments/configs/qwen7b.yaml"} <= names


def test_the_checker_catches_broken_references(tmp_path: Path) -> None:
    """The checker can fail: every kind of bad reference in a fake repository is reported, good ones are not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## A section\n")
    (tmp_path / "BENCHMARKS.md").write_text("# B\n")
    readme = tmp_path / "README.md"
    good = ("[ok](docs/other.md) [ok](docs/other.md#a-section) [web](https://example.com) docs/other.md "
            "BENCHMARKS.md `cells/*/metrics.json` s3://bucket/docs/x.md")
    assert broken_references(readme, good, tmp_path) == []
    bad = {
        "[spec](../shared/SPEC.md)": "outside the repository",
        "see `../shared/SPEC.md`": "not in the repository",
        "[gone](docs/missing.md)": "no such file",
        "[anchor](docs/other.md#no-such-section)": "no heading",
        "walkthrough: docs/missing.md": "no such file or directory",
        "(NOTES.md)": "no such file beside",
    }
    for text, why in bad.items():
        problems = broken_references(readme, text, tmp_path)
        assert problems and why in " ".join(problems), (text, problems)


def test_paths_into_ignored_output_are_not_checked_whether_or_not_they_exist(tmp_path: Path) -> None:
    """A fresh clone has no test-output/; after a test writes some of it, a reference to another file there must
    not start failing (under pytest-xdist the order of tests differs)."""
    (tmp_path / ".gitignore").write_text("test-output/\n/results/\n*.pyc\n")
    readme = tmp_path / "README.md"
    text = "counts in `test-output/pool.json`; reports in results/NAME/report"
    assert broken_references(readme, text, tmp_path) == []
    (tmp_path / "test-output").mkdir()
    (tmp_path / "results").mkdir()
    assert broken_references(readme, text, tmp_path) == []
    (tmp_path / "docs").mkdir()
    assert broken_references(readme, "docs/missing.md", tmp_path)  # a tracked top-level entry is still checked


def test_yaml_checks_comments_only(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("# see ../shared/SPEC.md\nstore: results  # see NOTES.md\nname: docs/x\n")
    text = _text(config)
    assert "name: docs/x" not in text
    problems = broken_references(config, text, tmp_path)
    assert any("../shared/SPEC.md" in p for p in problems) and any("NOTES.md" in p for p in problems)
