"""What a vLLM engine's first sleep pays for pinned host memory, under PyTorch's host-allocator settings.

A level-1 sleep copies each weight allocation to a new pinned CPU tensor (vLLM's CuMemAllocator.sleep:
`torch.empty(size, device="cpu", pin_memory=True)` then a copy). The first sleep of a process measured 16 s for the
7B base's 13.5 GiB on the H200, later ones 0.4 s: PyTorch's caching host allocator keeps the pinned blocks (rounded
up to powers of two) once they exist, so the first sleep is mostly pinning fresh pages. PyTorch can pin by
registering memory that several threads have touched (`PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True,
pinned_num_register_threads:N`) instead of one cudaHostAlloc per block. This script does what such a sleep does,
one allocation per weight tensor of Qwen2.5-7B's shape, in a fresh process per setting, twice (first and cached):

    python3 benchmarks/pinned_host_bench.py            # on a GPU machine; writes pinned_host_<gpu>.json
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

from gpu_common import QWEN7B_SHAPE, environment, out_dir, write  # noqa: E402

_16 = "pinned_use_cuda_host_register:True,pinned_num_register_threads:16"
# label -> (PYTORCH_CUDA_ALLOC_CONF, when the child sets it: before Python starts, after `import torch`, or after
# reading the GPU's properties, which initialises CUDA): PyTorch reads the setting when CUDA initialises (measured on
# an H100, pinned_host_order_h100.txt), so a process must set it before anything touches the GPU.
SETTINGS = {
    "default (cudaHostAlloc)": ("", "start"),
    "host register, 8 threads": ("pinned_use_cuda_host_register:True,pinned_num_register_threads:8", "start"),
    "host register, 16 threads": (_16, "start"),
    "16 threads, set after import torch": (_16, "import"),
    "16 threads, set after CUDA init": (_16, "cuda"),
}


def weight_bytes() -> list[int]:
    """Each bf16 weight tensor of the 7B shape as vLLM holds it (q/k/v and gate/up fused)."""
    s = QWEN7B_SHAPE
    h, i, kv = s["hidden_size"], s["intermediate_size"], s["num_key_value_heads"] * s["hidden_size"] // s["num_attention_heads"]
    layer = [(h + 2 * kv) * h, h * h, 2 * i * h, h * i, h, h]
    return [2 * n for n in [s["vocab_size"] * h, *layer * s["num_hidden_layers"], h, s["vocab_size"] * h]]


def one_setting() -> dict:
    import torch

    conf, when = os.environ.get("EPS_PIN_CONF", ""), os.environ.get("EPS_PIN_WHEN", "start")
    if when == "cuda":
        torch.cuda.get_device_properties(0)
    if when != "start":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
    sizes = weight_bytes()
    on_gpu = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
    torch.cuda.synchronize()
    out = {"tensors": len(sizes), "gib": sum(sizes) / 2**30}
    for rnd in ("first", "cached"):
        started = time.perf_counter()
        backups = []
        for t in on_gpu:
            cpu = torch.empty(t.numel(), dtype=torch.uint8, device="cpu", pin_memory=True)
            cpu.copy_(t)  # synchronous, as vLLM's cudaMemcpy
            backups.append(cpu)
        out[f"{rnd}_s"] = time.perf_counter() - started
        del backups  # back to the caching host allocator, as a wake frees the backups
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--name", default="pinned_host_h200.json")
    ap.add_argument("--settings", help="labels of SETTINGS to run, separated by semicolons (default: all)")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_setting()))
        return
    result = {"environment": environment(), "command": " ".join(["python3", *sys.argv]), "runs": {}}
    chosen = args.settings.split(";") if args.settings else list(SETTINGS)
    for label, (conf, when) in ((k, SETTINGS[k]) for k in chosen):
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": conf if when == "start" else "", "EPS_PIN_CONF": conf,
               "EPS_PIN_WHEN": when}
        done = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True)
        if done.returncode:
            result["runs"][label] = {"error": done.stderr[-2000:]}
            print(label, "failed:", done.stderr[-500:])
            continue
        run = result["runs"][label] = {"conf": conf, "set": when, **json.loads(done.stdout.strip().splitlines()[-1])}
        print(f"{label:28s} {run['gib']:.1f} GiB in {run['tensors']} tensors: first {run['first_s']:.2f} s "
              f"({run['gib'] / run['first_s']:.1f} GiB/s), cached {run['cached_s']:.2f} s")
    path = out_dir() / args.name
    write(path, result)
    print("written", path)


if __name__ == "__main__":
    main()
