"""What vLLM's lookup of a model's architecture costs a fresh process, with and without its cache: the step
`eps-screen models prepare` now takes off an engine's first start.

    python benchmarks/engine_facts_bench.py --model DIR [--runs 3] [--name FILE]

Each run times two fresh Python processes that build vLLM's ModelConfig for DIR (what an engine's start does before
it resolves the architecture): one with an empty VLLM_CACHE_ROOT (vLLM asks yet another new process, which imports
vLLM, for the architecture's facts) and one with a root that holds them. Interleaved, so both see the same machine.
Prints JSON (and writes it to FILE).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CODE = ("import sys, time; from vllm.config import ModelConfig; t = time.perf_counter();"
        " ModelConfig(model=sys.argv[1], tokenizer=sys.argv[1]); print(time.perf_counter() - t)")


def timed(model: str, cache: Path) -> float:
    """Seconds the ModelConfig took inside a fresh process (its imports not counted)."""
    out = subprocess.run([sys.executable, "-c", CODE, model], env={**os.environ, "VLLM_CACHE_ROOT": str(cache)},
                         capture_output=True, text=True, check=True)
    return round(float(out.stdout.strip().splitlines()[-1]), 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--name")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        warm = Path(tmp) / "warm"
        timed(args.model, warm)  # fills it
        runs = [{"empty_cache_s": timed(args.model, Path(tmp) / f"cold{i}"), "cached_s": timed(args.model, warm)}
                for i in range(args.runs)]
    payload = {"model": args.model, "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "runs": runs}
    print(json.dumps(payload, indent=1))
    if args.name:
        Path(args.name).write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
