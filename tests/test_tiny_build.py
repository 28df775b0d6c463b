"""The tiny models a screen needs are built side by side before its pre-screen (eps_screen.models.tiny.build_missing),
and a model built so is the one built alone, where it is first loaded: same files, same weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from eps_screen.models import tiny as tinymodel
from eps_screen.models.tiny import CONTAMINATION_MARKER

MODELS = [("tiny", CONTAMINATION_MARKER), ("tiny-alt", CONTAMINATION_MARKER)]


def _weights(path):
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


@pytest.mark.slow
def test_two_missing_models_are_built_side_by_side_as_each_alone(tmp_path, monkeypatch):
    alone = [tinymodel.tiny_model_path(*m) for m in MODELS]  # the session's cache: each built where first loaded
    monkeypatch.setenv("EPS_SCREEN_CACHE", str(tmp_path))
    assert not any(tinymodel._target(*m).exists() for m in MODELS)

    tinymodel.build_missing(MODELS)

    for (variant, marker), reference in zip(MODELS, alone, strict=True):
        built = tinymodel._target(variant, marker)
        assert (built / "config.json").exists(), f"{variant} was not built"
        assert sorted(p.name for p in built.iterdir()) == sorted(p.name for p in reference.iterdir())
        mine, theirs = _weights(built), _weights(reference)
        assert mine.keys() == theirs.keys()
        assert all((mine[k] == theirs[k]).all() for k in mine), f"{variant} built side by side differs"
    assert not [p for p in tmp_path.glob("tinymodel/.*") if p.is_dir()], "a build's temporary directory was left"


def test_models_already_built_or_a_single_missing_one_start_no_process(tmp_path, monkeypatch):
    monkeypatch.setenv("EPS_SCREEN_CACHE", str(tmp_path))
    started = []
    monkeypatch.setattr("concurrent.futures.ProcessPoolExecutor", lambda *a, **k: started.append(a))
    tinymodel.build_missing(MODELS[:1])  # one model: built where it is first loaded, not here
    assert not tinymodel._target(*MODELS[0]).exists() and not started
    for m in MODELS:
        (tinymodel._target(*m)).mkdir(parents=True)
        (tinymodel._target(*m) / "config.json").write_text("{}")
    tinymodel.build_missing(MODELS + MODELS)
    assert not started


@pytest.mark.slow
def test_a_model_two_processes_ask_for_at_once_is_built_once_and_both_get_it(tmp_path):
    """What lets local-gpu-screen.sh start the screen beside `eps-screen models prepare`: a job that asks for a model
    prepare is building waits for that build and takes its result (a second build would fail at its final rename)."""
    import os
    import subprocess
    import sys

    code = "from eps_screen.models.tiny import tiny_model_path; print(tiny_model_path('tiny-alt'))"
    env = {**os.environ, "EPS_SCREEN_CACHE": str(tmp_path)}
    asking = [subprocess.Popen([sys.executable, "-c", code], env=env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE) for _ in range(2)]
    said = [p.communicate() for p in asking]
    assert [p.returncode for p in asking] == [0, 0], [err[-2000:] for _, err in said]
    paths = {out.strip() for out, _ in said}
    assert len(paths) == 1 and (tmp_path / "tinymodel") in [p.parent for p in map(Path, paths)]
    assert (Path(paths.pop()) / "config.json").exists()
    assert not [p for p in tmp_path.glob("tinymodel/.*") if p.is_dir()], "a build's temporary directory was left"
