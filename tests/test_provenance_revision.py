"""An artifact's git revision says when the code that made it is not the commit it names."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from eps_screen.store import provenance


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_tree_that_differs_from_its_commit_is_named_dirty(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    pkg = repo / "eps_screen" / "store"
    pkg.mkdir(parents=True)
    (pkg / "provenance.py").write_text("x = 1\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.setattr(provenance, "__file__", str(pkg / "provenance.py"))
    provenance.git_revision.cache_clear()
    assert provenance.git_revision() == head
    (pkg / "provenance.py").write_text("x = 2\n")
    provenance.git_revision.cache_clear()
    assert provenance.git_revision() == head + "+dirty"
    provenance.git_revision.cache_clear()
