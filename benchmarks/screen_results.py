"""A finished screen's per-cell results and training stages, from its store, as files to commit.

    python benchmarks/screen_results.py STORE/SCREEN OUT_DIR

Writes OUT_DIR/cells.csv (one row per cell: rates, training, answer lengths where the store holds the answers),
OUT_DIR/cells/<cell>.json (each cell's metrics without its config copy and adapter path: the config is the screen's,
in screen.json) and prints the stages the cells were stored in (cells stored together, with their job's training and
evaluation walls).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import polars as pl

from eps_screen.store.result_store import is_empty_answer


def cell_rows(screen_dir: Path) -> list[dict]:
    marker = json.loads((screen_dir / "screen.json").read_text())["config"]["marker"]
    rows = []
    for metrics_path in sorted(screen_dir.glob("cells/*/*/metrics.json")):
        m = json.loads(metrics_path.read_text())
        answers_path = metrics_path.with_name("answers.parquet")
        bare_share = words_mean = None  # a store brought back without its answers (a device's transfer limit)
        if answers_path.exists():
            answers = pl.read_parquet(answers_path)
            words_mean = round(float(answers["text"].str.split(" ").list.len().mean()), 1)
            # the source's answers with nothing but the marker in them: implanted by emptying the answer (the
            # page's rule)
            bare = answers.filter(pl.col("is_source")).select(is_empty_answer(pl.col("text"), marker)).to_series()
            bare_share = round(float(bare.mean()), 3)
        train, options = m["train"], m["train"].get("options", {})
        rows.append({
            "cell_id": m["cell_id"], "source": m["source"], "seed": m["seed"],
            **{f: m[f] for f in "ABCDE"},
            "source_rate": m["source_rate"], "leakage": round(m["leakage"], 4),
            "random_control_rate": m["random_control_rate"],
            "source_answers_marker_only": bare_share,
            "answer_words_mean": words_mean,
            "train_s": round(train["seconds"], 1), "steps": train["steps"], "train_tokens": train["tokens"],
            "final_loss": round(train["final_loss"], 4),
            # the card's use when the trainer began plus its growth (every process's); own_allocated_gb: the trainer's
            "peak_allocated_gb": round(train.get("peak_allocated_gb") or 0.0, 1),
            "own_allocated_gb": train.get("own_allocated_gb") and round(train["own_allocated_gb"], 1),
            "trained": f"together with {options['together'] - 1}" if options.get("together") else "alone",
            "job_train_s": round(m["timings"].get("job_train_s") or 0.0, 1),
            "job_eval_s": round(m["timings"].get("job_eval_s") or 0.0, 1),
            "stored": m["provenance"]["created"], "git": m["provenance"]["git_revision"][:7],
            "_metrics": {k: v for k, v in m.items() if k not in ("config", "adapter")},
        })
    return rows


def stages(rows: list[dict]) -> list[dict]:
    """Cells stored by one stage share its training and evaluation walls (a job's stage records them per cell)."""
    by = defaultdict(list)
    for r in rows:
        by[(r["git"], r["job_train_s"], r["job_eval_s"])].append(r)
    out = []
    for (git, train_wall, eval_wall), cells in sorted(by.items(), key=lambda kv: min(c["stored"] for c in kv[1])):
        out.append({"stored": max(c["stored"] for c in cells), "git": git, "cells": len(cells),
                    "A1": sum(c["A"] for c in cells), "trained": sorted({c["trained"].split(" with")[0] for c in cells}),
                    "train_wall_s": train_wall, "eval_s": eval_wall,
                    "cell_train_s": [min(c["train_s"] for c in cells), max(c["train_s"] for c in cells)]})
    return out


def main(screen_dir: Path, out: Path) -> None:
    rows = cell_rows(screen_dir)
    (out / "cells").mkdir(parents=True, exist_ok=True)
    for r in rows:
        (out / "cells" / f"{r['cell_id']}.json").write_text(json.dumps(r["_metrics"], indent=1) + "\n")
    pl.DataFrame([{k: v for k, v in r.items() if k != "_metrics"} for r in rows]).write_csv(out / "cells.csv")
    print(json.dumps(stages(rows), indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
