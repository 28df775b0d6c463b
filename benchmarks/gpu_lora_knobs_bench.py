"""vLLM's LoRA serving knobs on one cell's evaluation (7B-shaped model, one H200): each variant is one run of
gpu_lora_eval_bench.py in its own process (a fresh engine; vLLM does not give a card back inside a process), and
the tokens/s of every variant land in one result file, so the ratios come from one machine and one session.

    python benchmarks/gpu_lora_knobs_bench.py                       # every variant (longer than one device call)
    python benchmarks/gpu_lora_knobs_bench.py --variants max_loras_1,dual_stream   # some; results are merged

The reference variant is the job's engine as shipped (max_loras 8, vLLM's H200 defaults: 1,024 sequences,
16,384 batched tokens, CUDA graphs up to 512 sequences); every other variant sets max_loras 1 (a per_cell job
serves one adapter per call) plus one more knob.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import environment, out_dir, write  # noqa: E402

ONE = ["--eval", "vllm_max_loras=1"]
# name: (arguments of gpu_lora_eval_bench.py, environment, why)
VARIANTS: dict[str, tuple[list[str], dict[str, str], str]] = {
    "shipped": (["--runs", "A0:warmup,A0:lora,A1:lora,A0:merged,A0:none"], {},
                "the job's engine; also the merged path (its merge now on the GPU) and no adapter"),
    "max_loras_1": (ONE, {}, "LoRA kernels' grid sized for one adapter instead of 8 (+1 for no adapter)"),
    "seqs_512": (ONE + ["--eval", "vllm_max_num_seqs=512"], {}, "every decode batch inside the CUDA-graph sizes"),
    "graphs_1024": (ONE + ["--engine-arg", 'compilation_config={"max_cudagraph_capture_size": 1024}'], {},
                    "CUDA graphs captured up to the 1,024-sequence decode batch"),
    "dual_stream": (ONE, {"VLLM_LORA_ENABLE_DUAL_STREAM": "1"}, "LoRA kernels on a second CUDA stream"),
    "batched_32k": (ONE + ["--engine-arg", "max_num_batched_tokens=32768"], {},
                    "chunked-prefill budget doubled (A1's long prompts)"),
    "throughput": (ONE + ["--engine-arg", "performance_mode=throughput"], {},
                   "vLLM's throughput mode (doubles sequences and batched tokens)"),
}
DEFAULT_RUNS = "A0:warmup,A0:lora,A1:lora"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma list (default: %(default)s)")
    ap.add_argument("--timeout", type=float, default=400, help="seconds per variant (default: %(default)s)")
    ap.add_argument("--name", default="gpu_lora_knobs_h200.json", help="result file name (default: %(default)s)")
    args = ap.parse_args()

    out = out_dir() / args.name
    result = json.loads(out.read_text()) if out.exists() else {"environment": environment(), "variants": {}}
    bench = Path(__file__).with_name("gpu_lora_eval_bench.py")
    for name in args.variants.split(","):
        argv, env, why = VARIANTS[name]
        if "--runs" not in argv:
            argv = [*argv, "--runs", DEFAULT_RUNS]
        part = f"knob_{name}.json"
        started = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, str(bench), *argv, "--name", part], env={**os.environ, **env},
                                  timeout=args.timeout, capture_output=True, text=True)
            error = None if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr[-2000:]}"
        except subprocess.TimeoutExpired:
            error = f"timed out after {args.timeout} s"
        wall = time.perf_counter() - started
        measured = json.loads((out_dir() / part).read_text()) if (out_dir() / part).exists() else {}
        runs = measured.get("runs", {})
        result["variants"][name] = {
            "why": why, "args": argv, "env": env, "error": error, "wall_s": wall,
            "engine_start_s": measured.get("engine_start_s"),
            "tokens_per_s": {run: r.get("tokens_per_s") for run, r in runs.items() if run != "A0:warmup"},
            "merge_s": [s for engine in measured.get("engine", {}).values() for s in engine.get("merge_s", [])],
            "merge_check": measured.get("merge_check"),
        }
        line = ", ".join(f"{run} {tps:,.0f}" for run, tps in result["variants"][name]["tokens_per_s"].items() if tps)
        print(f"{name}: {line or error} (start {measured.get('engine_start_s') or 0:.0f} s, wall {wall:.0f} s)",
              flush=True)
        write(out, result)


if __name__ == "__main__":
    main()
