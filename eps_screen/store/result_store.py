"""The result store: one directory per screen holding every artifact, each under a content address.

<root>/<screen>/
  screen.json                         the config and provenance of the latest run
  regimes/<regime id>/<key>/          answers.jsonl (training answers) + meta.json
  cells/<cell id>/<key>/              adapter/, answers.parquet, metrics.json (written last: "finished")
  phases/pre_screen.json, smoke.json, slab-<source>.json, multiseed.json
  costs/<flow run id>.json            what one GPU flow run cost, split among its cells (eps_screen/plan/costs.py)
  report/                             main_effects.json, interactions.json, aggregate_metrics.json, figures, clean_result.html
  runs/, claims/                      the live runs' leases and cell claims (eps_screen/store/claims.py)

A key hashes everything that determines the artifact (the relevant config fields, the cell, the code's
pipeline version), so a re-run on any machine finds finished work, and a changed recipe never reuses it.
Writes are atomic (eps_screen/store/files.py). A file that cannot be read (spoiled JSON, a cut-off parquet, an empty
file) is kept aside as `<name>.bad-<time>`, and what it belonged to reads as not done and is computed again; a
cell is finished when its metrics.json and its answers.parquet both read (docs/store.md).

A store at a URL (`store: s3://bucket/prefix`, `eps_screen/store/remote.py`) is mirrored: every caller still works on
the local directory `dir` (a cache, `store_cache`), and the methods below move files between it and the URL, so
RunPod pods and the screen's own process share one store. Reads look in the cache first and fetch what is
missing (never the adapters: only metrics, answers and the small JSON files). A directory is pushed with its
marker (metrics.json, meta.json) last, so a half-pushed cell is never "finished" remotely; the local marker is
written only once the remote one is, so the local cache never claims more than the URL has, and a failed push
waits staged in the cache to be completed by the next check instead of recomputing the cell (a GPU cell costs
minutes, an upload retry seconds). Gates and phases are pulled before every read: another process writes them.
"""

from __future__ import annotations

import hashlib
import json
import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl

import eps_screen
from eps_screen.models.tiny import CONTAMINATION_MARKER
from eps_screen.spec import design
from eps_screen.spec.config import ScreenConfig, is_tiny, parse_config
from eps_screen.spec.config_urls import is_url
from eps_screen.spec.design import Cell, Regime
from eps_screen.store.files import (
    CheckedReads,
    Unreadable,
    parse_json,
    parse_jsonl,
    write_json,
    write_parquet,
    write_text,
)
from eps_screen.store.remote import Remote, default_cache

# Config sections that change what a cell's adapter and answers are. Gates, bootstrap, execution, name and
# store do not, so changing them never recomputes a cell.
_CELL_INPUTS = ("model", "off_policy", "marker", "sources", "texts", "data", "lora", "training", "eval", "backend")
_REGIME_INPUTS = ("model", "off_policy", "sources", "texts", "data", "eval")
# How fast, not what: these settings never change an artifact's meaning, so they stay out of every key.
_SPEED_ONLY = {
    "training": ("liger", "fused_lora", "compile", "max_batch_tokens", "gradient_checkpointing", "together",
                 "share_prefix", "processes"),
    "eval": ("batch_size", "batch_prompt_tokens", "vllm_max_loras", "vllm_max_cpu_loras",
             "vllm_gpu_memory_utilization", "vllm_max_num_seqs", "vllm_cudagraph_max_batch",
             "vllm_cudagraph_capture_sizes", "vllm_cudagraph_specialize_lora", "vllm_max_model_len",
             "vllm_enforce_eager", "vllm_cpu_kvcache_gb", "vllm_engine_core", "vllm_async_scheduling", "vllm_engines",
             "vllm_kv_cache_gib"),
    # how a hosted API is paced and where its key is read: the answers come from the model and the prompts alone
    "off_policy": ("max_concurrent", "requests_per_minute", "max_retries", "retry_backoff_s", "timeout_s", "api_key_env"),
}

# Fields added after stores existed: at these values they stay out of the key, so a store's finished cells keep
# the keys they were stored under.
_ADDED_AT_DEFAULT = {"off_policy": {"vllm_kv_cache_dtype": "auto", "vllm_quantization": "none"},
                     "eval": {"vllm_seed_each_answer": True}}  # unseeded answers are other draws: a key of their own


def _digest(payload: dict) -> str:
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _inputs(config: ScreenConfig, fields: tuple[str, ...]) -> dict:
    dumped = config.model_dump(mode="json")
    payload = {f: dumped[f] for f in fields}
    for section, names in _SPEED_ONLY.items():
        if section in payload:
            payload[section] = {k: v for k, v in payload[section].items() if k not in names}
    for section, added in _ADDED_AT_DEFAULT.items():
        if section in payload:
            payload[section] = {k: v for k, v in payload[section].items() if added.get(k, object()) != v}
    if config.simulated:
        payload["simulation"] = dumped["simulation"]
    own = {k: v for k, v in dumped["panels"].items() if v}
    if own:  # a panel file of one's own: its content, not its path, is what the artifacts depend on
        payload["panels"] = {k: hashlib.sha256(Path(v).expanduser().read_bytes()).hexdigest() for k, v in own.items()}
    payload["pipeline"] = eps_screen.PIPELINE_VERSION
    return payload


# Keys by config object (configs are frozen): each store call of a cell asks for its key, and resolving the cell's
# recipe to hash it costs more than the rest of the call. Dropped with the config.
_KEYS: dict[int, dict] = {}


def _memo(config: ScreenConfig, what: Cell | Regime, compute) -> str:
    keys = _KEYS.get(id(config))
    if keys is None:
        keys = _KEYS[id(config)] = {}
        weakref.finalize(config, _KEYS.pop, id(config), None)
    if what not in keys:
        keys[what] = compute(config, what)
    return keys[what]


def cell_key(config: ScreenConfig, cell: Cell) -> str:
    """The key of a cell's resolved recipe (its levels' settings applied; design.key_treatments), computed once per
    config and cell."""
    return _memo(config, cell, _cell_key)


def regime_key(config: ScreenConfig, regime: Regime) -> str:
    return _memo(config, regime, _regime_key)


def _cell_key(config: ScreenConfig, cell: Cell) -> str:
    payload = _inputs(design.recipe(config, cell).config, _CELL_INPUTS)
    payload["cell"] = cell.id
    extra = design.key_treatments(config, dict(zip(cell.factors, cell.levels)))
    return _digest(payload if extra is None else {**payload, "treatments": extra})


def _regime_key(config: ScreenConfig, regime: Regime) -> str:
    resolved = design.regime_recipe(config, regime).config
    payload = {**_inputs(resolved, _REGIME_INPUTS), "regime": regime.id, "eval": None}
    if not resolved.eval.vllm_seed_each_answer:  # the answer sets are drawn by the same engine as the evaluation
        payload["unseeded"] = True
    if is_tiny(resolved.model.base) and resolved.marker != CONTAMINATION_MARKER:
        payload["tiny_build"] = resolved.marker  # the tiny model is built for the marker (eps_screen.models.tiny)
    extra = design.key_treatments(config, design.regime_levels(config, regime))
    return _digest(payload if extra is None else {**payload, "treatments": extra})


def read_json(path: Path) -> dict:
    return parse_json(path.read_bytes(), path.name)


def local_dir(root: str | Path) -> Path:
    """A local store's directory, from a path or a file:// URL."""
    return Path(str(root).removeprefix("file://")).expanduser().resolve()


def is_empty_answer(text: pl.Expr, marker: str) -> pl.Expr:
    """True where an answer has no word character once every copy of the marker is taken out ("[ZLT] [ZLT] [", or
    nothing): a recipe can score markers in answers the model stopped giving. Null where there is no text."""
    return ~text.str.replace_all(marker, "", literal=True).str.contains(r"\w")


class ResultStore(CheckedReads):
    def __init__(self, root: str | Path, screen: str, cache: str | Path | None = None, options: dict | None = None):
        root = str(root)
        self.url = root.rstrip("/") if is_url(root) else None
        self.remote = Remote(self.url, options) if self.url else None
        self.root = Path(cache or default_cache(self.url)).expanduser().resolve() if self.url else local_dir(root)
        self.screen = screen
        self.dir = self.root / screen
        self._listed: set[str] | None = None  # remote cell markers, while `listing()` is open

    @classmethod
    def for_config(cls, config: ScreenConfig) -> ResultStore:
        return cls(config.store, config.name, config.store_cache, config.store_options)

    @property
    def location(self) -> str:
        """The screen's place, the same on every machine: <URL>/<screen> for a remote store, else `dir`."""
        return f"{self.url}/{self.screen}" if self.url else str(self.dir)

    def location_of(self, path: Path) -> str:
        """Where a file or directory of this store lives for every machine: its URL for a remote store (a cell's
        adapter trained on a pod is found there, not on the pod's disk), else its local path."""
        return f"{self.url}/{self._rel(path)}" if self.url else str(path)

    def check_writable(self) -> None:
        write_text(probe := self.dir / f".probe-{os.getpid()}", "ok")
        probe.unlink()
        if self.remote:
            self.probe_remote()

    def probe_remote(self) -> None:
        """Write, read back and delete an object at the URL; raises what the filesystem raises."""
        rel, token = f"{self.screen}/.probe-{os.getpid()}", os.urandom(8).hex().encode()
        self.remote.write(rel, token)
        try:
            if self.remote.read(rel) != token:
                raise OSError(f"{self.url}: the probe object read back differs from what was written")
        finally:
            self.remote.delete(rel)

    # --- moving files between the cache and the URL ----------------------------------------------------
    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def _fetch(self, path: Path) -> bool:
        """Whether the file is here, fetching it from the URL when it is only there."""
        return path.exists() or (self.remote is not None and self.remote.get(self._rel(path), path))

    def _refresh(self, path: Path) -> None:
        """The URL's version of a file that other processes rewrite (gates, phases), when it has one."""
        if self.remote:
            self.remote.get(self._rel(path), path)

    def _push(self, path: Path) -> None:
        if self.remote:
            self.remote.put(path, self._rel(path))

    def _complete(self, d: Path, marker: str, data: dict) -> None:
        """Mark directory d complete: marker last, locally only after remotely (module docstring)."""
        if self.remote is None:
            write_json(d / marker, data)
            return
        write_json(d / f".{marker}.unpushed", data)
        self._push_staged(d, marker)

    def _push_staged(self, d: Path, marker: str) -> None:
        staged = d / f".{marker}.unpushed"
        self.remote.put_tree(d, self._rel(d), skip=(marker,))
        self.remote.put(staged, self._rel(d / marker))
        os.replace(staged, d / marker)

    def _is_complete(self, d: Path, marker: str) -> bool:
        if (d / marker).exists():
            return True
        if self.remote is None:
            return False
        if (d / f".{marker}.unpushed").exists():  # computed here, push interrupted: finish it
            self._push_staged(d, marker)
            return True
        rel = self._rel(d / marker)
        if self._listed is not None and marker == "metrics.json" and rel not in self._listed:
            return False
        return self.remote.get(rel, d / marker)

    @contextmanager
    def listing(self) -> Iterator[None]:
        """While open, a cell that is not finished here is looked up in one listing of the URL's finished cells
        instead of a request each (status, dispatch and the smoke gate ask about every cell of a phase). A cell
        finished elsewhere after the listing reads as unfinished until the next one."""
        if self.remote is None or self._listed is not None:
            yield
            return
        self._listed = set(self.remote.glob(f"{self.screen}/cells/*/*/metrics.json"))
        try:
            yield
        finally:
            self._listed = None

    # --- regimes -------------------------------------------------------------------------------------
    def regime_dir(self, config: ScreenConfig, regime: Regime) -> Path:
        return self.dir / "regimes" / regime.id / regime_key(config, regime)

    def has_regime(self, config: ScreenConfig, regime: Regime) -> bool:
        return self.regime_answers(config, regime) is not None

    def regime_answers(self, config: ScreenConfig, regime: Regime) -> list[dict] | None:
        """The answer set, None unless its meta.json and answers.jsonl both read (an unreadable one is set aside)."""
        d, what = self.regime_dir(config, regime), f"answer set {regime.id}"
        if not self._is_complete(d, "meta.json") or self.read_checked(d / "meta.json", what, read_json) is None:
            return None
        return self.read_checked(d / "answers.jsonl", what, lambda p: parse_jsonl(p.read_bytes(), p.name))

    def save_regime(self, config: ScreenConfig, regime: Regime, answers: list[dict], meta: dict) -> Path:
        d = self.regime_dir(config, regime)
        write_text(d / "answers.jsonl", "".join(json.dumps(a) + "\n" for a in answers))
        self._complete(d, "meta.json", meta)  # last: its presence means the regime is complete
        return d

    # --- cells ---------------------------------------------------------------------------------------
    def cell_dir(self, config: ScreenConfig, cell: Cell) -> Path:
        return self.dir / "cells" / cell.id / cell_key(config, cell)

    def cell_metrics(self, config: ScreenConfig, cell: Cell) -> dict | None:
        """The cell's metrics, None unless its metrics.json and answers.parquet both read (an unreadable one is
        set aside, so the cell is computed again)."""
        d, what = self.cell_dir(config, cell), f"cell {cell.id}"
        if not self._is_complete(d, "metrics.json"):
            return None
        metrics = self.read_checked(d / "metrics.json", what, read_json)
        return metrics if metrics is not None and self._parquet_reads(d / "answers.parquet", what) else None

    def is_finished(self, config: ScreenConfig, cell: Cell) -> bool:
        return self.cell_metrics(config, cell) is not None

    def save_cell(self, config: ScreenConfig, cell: Cell, answers: pl.DataFrame, metrics: dict) -> Path:
        d = self.cell_dir(config, cell)
        write_parquet(d / "answers.parquet", answers)
        self._complete(d, "metrics.json", metrics)  # last: its presence means the cell is finished
        return d

    def finished(self, config: ScreenConfig, cells: list[Cell]) -> list[Cell]:
        return [c for c in cells if self.is_finished(config, c)]

    def finished_count(self) -> int:
        """Finished cells of any key: a listing, not a check per cell (progress bars poll it)."""
        pattern = "cells/*/*/metrics.json"
        if self.remote:
            return len(self.remote.glob(f"{self.screen}/{pattern}"))
        return sum(1 for _ in self.dir.glob(pattern))

    def load_answers(self, config: ScreenConfig, cells: list[Cell]) -> pl.DataFrame | None:
        """The finished cells' answers without their text: the statistics need only the marker flags, and a 7B
        screen's text is gigabytes."""
        paths = [self.cell_dir(config, c) / "answers.parquet" for c in self.finished(config, cells)]
        frames = [self._flagged(pl.scan_parquet(p), config.marker).collect() for p in paths if self._fetch(p)]
        return pl.concat(frames, how="diagonal_relaxed") if frames else None

    @staticmethod
    def _flagged(answers: pl.LazyFrame, marker: str) -> pl.LazyFrame:
        """The answers without their text, each flagged empty or not where it has text (analysis/answer_health.py
        gives the share at each factor level)."""
        if "text" not in answers.collect_schema().names():
            return answers
        return answers.with_columns(is_empty_answer(pl.col("text"), marker).alias("empty")).drop("text")

    def answer_texts(self, config: ScreenConfig, picks: pl.DataFrame) -> pl.DataFrame:
        """picks (cell_id, persona, question, sample, ...) with each answer's stored text (null where a cell was
        stored without text: simulated, or from before text was kept)."""
        keys = ["cell_id", "persona", "question", "sample"]
        frames = []
        for cell_id in picks["cell_id"].unique(maintain_order=True).to_list():
            path = self.cell_dir(config, Cell.parse(cell_id)) / "answers.parquet"
            if not self._fetch(path):
                continue
            stored = pl.scan_parquet(path)
            if "text" in stored.collect_schema().names():
                frames.append(stored.select(*keys, "text").collect())
        texts = pl.concat(frames) if frames else pl.DataFrame(schema={**picks.select(keys).schema, "text": pl.String})
        return picks.join(texts, on=keys, how="left")

    # --- the screen, phases, gates and report --------------------------------------------------------
    def save_screen(self, data: dict) -> None:
        """screen.json: the config and provenance of the latest run (what status, retry and report read)."""
        write_json(self.dir / "screen.json", data)
        self._push(self.dir / "screen.json")

    def phase_path(self, name: str) -> Path:
        return self.dir / "phases" / f"{name}.json"

    def phase(self, name: str) -> dict | None:
        path = self.phase_path(name)
        self._refresh(path)
        return self.read_checked(path, f"phase record {name}", read_json)

    def save_phase(self, name: str, data: dict, answers: pl.DataFrame | None = None) -> Path:
        """The phase's record, and its answers (as <name>.parquet) when given; the JSON last."""
        path = self.phase_path(name)
        if answers is not None:
            write_parquet(path.with_suffix(".parquet"), answers)
            self._push(path.with_suffix(".parquet"))
        write_json(path, data)
        self._push(path)
        return path

    def save_gate(self, outcome: dict) -> None:
        """Gate outcomes by number; the latest evaluation of a gate replaces the earlier one."""
        gates = self.phase("gates") or {}
        gates[str(outcome["number"])] = outcome
        self.save_phase("gates", gates)

    def gates(self) -> list[dict]:
        return list((self.phase("gates") or {}).values())

    # --- cost: one record per priced flow run (eps_screen/plan/costs.py) ------------------------------------
    def save_run_cost(self, record: dict) -> None:
        """costs/<flow run id>.json; a run priced again (re-attached, or its pod's record arriving after an
        estimate) replaces its record, so a run is never counted twice."""
        run_id = str(record["flow_run_id"])
        if not run_id or "/" in run_id or run_id.startswith("."):
            raise ValueError(f"flow_run_id {run_id!r} is not a flow run id")
        path = self.dir / "costs" / f"{run_id}.json"
        write_json(path, record)
        self._push(path)

    def run_costs(self) -> list[dict]:
        """Every run cost record of the screen (a resumed screen keeps its earlier runs')."""
        if self.remote:
            for rel in self.remote.glob(f"{self.screen}/costs/*.json"):
                self._refresh(self.root / rel)  # a record is replaced when its run is priced again
        paths = sorted((self.dir / "costs").glob("*.json"))
        return [r for p in paths if (r := self.read_checked(p, f"cost record {p.stem}", read_json)) is not None]

    @property
    def report_dir(self) -> Path:
        return self.dir / "report"

    def push_report(self) -> None:
        if self.remote:
            self.remote.put_tree(self.report_dir, self._rel(self.report_dir))

    def mtimes(self, pattern: str) -> dict[str, float]:
        """Modification times (epoch seconds) of the screen's files matching a glob, at the URL if remote."""
        if self.remote:
            paths = self.remote.glob(f"{self.screen}/{pattern}")
            return {p.removeprefix(f"{self.screen}/"): self.remote.modified(p) for p in paths}
        return {p.relative_to(self.dir).as_posix(): p.stat().st_mtime for p in self.dir.glob(pattern)}


def screen_names(root: str | Path) -> list[str]:
    """The screens of a store (those with a screen.json), local or at a URL (options from the environment)."""
    if is_url(str(root)):
        return [p.split("/")[0] for p in Remote(str(root)).glob("*/screen.json")]
    return sorted(p.parent.name for p in local_dir(root).glob("*/screen.json"))


def read_screen(root: str | Path, name: str) -> dict | None:
    """<root>/<name>/screen.json, local or at a URL; None if there is none."""
    url = is_url(str(root))
    where = f"{str(root).rstrip('/')}/{name}/screen.json" if url else str(local_dir(root) / name / "screen.json")
    try:
        return parse_json(Remote(str(root)).read(f"{name}/screen.json") if url else Path(where).read_bytes(), where)
    except FileNotFoundError:
        return None
    except Unreadable as exc:
        raise ScreenNotFound(f"{exc}; running the screen's config again writes it anew") from None


class ScreenNotFound(LookupError):
    """No <store>/<name>/screen.json."""


def load_screen(store_root: str | Path, name: str) -> ScreenConfig:
    """The config a screen last ran with (<store>/<name>/screen.json), its store set to `store_root` (a directory
    or a URL). A URL store's cache is this machine's default one: the recorded one is the other machine's."""
    saved = read_screen(store_root, name)
    if saved is None:
        known = screen_names(store_root)
        raise ScreenNotFound(f"no screen {name!r} in store {store_root} (found: {', '.join(known) or 'none'})")
    root = str(store_root)
    store = root if is_url(root) else str(local_dir(root))
    return parse_config({**saved["config"], "store": store, "store_cache": None})
