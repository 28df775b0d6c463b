"""The result store: one directory per screen holding every artifact, each under a content address.

<root>/<screen>/
  screen.json                         the config and provenance of the latest run
  regimes/<regime id>/<key>/          answers.jsonl (training answers) + meta.json
  cells/<cell id>/<key>/              adapter/, answers.parquet, metrics.json (written last: "finished")
  phases/pre_screen.json, smoke.json, slab-<source>.json, multiseed.json
  report/                             main_effects.json, interactions.json, aggregate_metrics.json, figures, clean_result.html

A key hashes everything that determines the artifact (the relevant config fields, the cell, the code's
pipeline version), so a re-run on any machine finds finished work, and a changed recipe never reuses it.
Writes are atomic (temp file + rename): a crash never leaves a half-written "finished" marker.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import polars as pl

import eps_screen
from eps_screen.config import ScreenConfig
from eps_screen.design import Cell, Regime

# Config sections that change what a cell's adapter and answers are. Gates, bootstrap, execution, name and
# store do not, so changing them never recomputes a cell.
_CELL_INPUTS = ("model", "off_policy", "marker", "sources", "texts", "data", "lora", "training", "eval", "backend")
_REGIME_INPUTS = ("model", "off_policy", "sources", "texts", "data", "eval")
# How fast, not what: these settings never change an artifact's meaning, so they stay out of every key.
_SPEED_ONLY = {
    "training": ("liger", "fused_lora", "compile", "max_batch_tokens", "gradient_checkpointing"),
    "eval": ("batch_size", "vllm_max_loras", "vllm_max_cpu_loras", "vllm_gpu_memory_utilization",
             "vllm_max_model_len", "vllm_enforce_eager", "vllm_cpu_kvcache_gb"),
}


def _digest(payload: dict) -> str:
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _inputs(config: ScreenConfig, fields: tuple[str, ...]) -> dict:
    dumped = config.model_dump(mode="json")
    payload = {f: dumped[f] for f in fields}
    for section, names in _SPEED_ONLY.items():
        if section in payload:
            payload[section] = {k: v for k, v in payload[section].items() if k not in names}
    if config.simulated:
        payload["simulation"] = dumped["simulation"]
    payload["pipeline"] = eps_screen.PIPELINE_VERSION
    return payload


def cell_key(config: ScreenConfig, cell: Cell) -> str:
    payload = _inputs(config, _CELL_INPUTS)
    payload["cell"] = cell.id
    return _digest(payload)


def regime_key(config: ScreenConfig, regime: Regime) -> str:
    return _digest({**_inputs(config, _REGIME_INPUTS), "regime": regime.id, "eval": None})


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, default=str)
    os.replace(tmp, path)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


class ResultStore:
    def __init__(self, root: str | Path, screen: str):
        if "://" in str(root) and not str(root).startswith("file://"):
            raise ValueError(f"store {root!r}: only local paths (or file://) are supported so far")
        self.root = Path(str(root).removeprefix("file://")).expanduser().resolve()
        self.screen = screen
        self.dir = self.root / screen

    @classmethod
    def for_config(cls, config: ScreenConfig) -> ResultStore:
        return cls(config.store, config.name)

    def check_writable(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        probe = self.dir / f".probe-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()

    # --- regimes -------------------------------------------------------------------------------------
    def regime_dir(self, config: ScreenConfig, regime: Regime) -> Path:
        return self.dir / "regimes" / regime.id / regime_key(config, regime)

    def regime_answers(self, config: ScreenConfig, regime: Regime) -> list[dict] | None:
        path = self.regime_dir(config, regime) / "answers.jsonl"
        if not (path.parent / "meta.json").exists():
            return None
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def save_regime(self, config: ScreenConfig, regime: Regime, answers: list[dict], meta: dict) -> Path:
        d = self.regime_dir(config, regime)
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".answers.")
        with os.fdopen(fd, "w") as f:
            f.writelines(json.dumps(a) + "\n" for a in answers)
        os.replace(tmp, d / "answers.jsonl")
        write_json(d / "meta.json", meta)  # last: its presence means the regime is complete
        return d

    # --- cells ---------------------------------------------------------------------------------------
    def cell_dir(self, config: ScreenConfig, cell: Cell) -> Path:
        return self.dir / "cells" / cell.id / cell_key(config, cell)

    def cell_metrics(self, config: ScreenConfig, cell: Cell) -> dict | None:
        path = self.cell_dir(config, cell) / "metrics.json"
        return read_json(path) if path.exists() else None

    def is_finished(self, config: ScreenConfig, cell: Cell) -> bool:
        return (self.cell_dir(config, cell) / "metrics.json").exists()

    def save_cell(self, config: ScreenConfig, cell: Cell, answers: pl.DataFrame, metrics: dict) -> Path:
        d = self.cell_dir(config, cell)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / ".answers.parquet.tmp"
        answers.write_parquet(tmp)
        os.replace(tmp, d / "answers.parquet")
        write_json(d / "metrics.json", metrics)  # last: its presence means the cell is finished
        return d

    def finished(self, config: ScreenConfig, cells: list[Cell]) -> list[Cell]:
        return [c for c in cells if self.is_finished(config, c)]

    def load_answers(self, config: ScreenConfig, cells: list[Cell]) -> pl.DataFrame | None:
        frames = [pl.read_parquet(self.cell_dir(config, c) / "answers.parquet") for c in self.finished(config, cells)]
        return pl.concat(frames) if frames else None

    # --- phases, gates and report --------------------------------------------------------------------
    def phase_path(self, name: str) -> Path:
        return self.dir / "phases" / f"{name}.json"

    def save_phase(self, name: str, data: dict) -> Path:
        path = self.phase_path(name)
        write_json(path, data)
        return path

    def save_gate(self, outcome: dict) -> None:
        """Gate outcomes by number; the latest evaluation of a gate replaces the earlier one."""
        path = self.phase_path("gates")
        gates = read_json(path) if path.exists() else {}
        gates[str(outcome["number"])] = outcome
        write_json(path, gates)

    def gates(self) -> list[dict]:
        path = self.phase_path("gates")
        return list(read_json(path).values()) if path.exists() else []

    @property
    def report_dir(self) -> Path:
        return self.dir / "report"
