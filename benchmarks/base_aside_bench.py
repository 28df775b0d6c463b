"""The training base set aside while the off-policy engine runs (models.bases_to_host) and back on the card
(models.load_base), on a GPU: seconds each way, and the memory the driver reports free before, between and after
(what an engine in another process can size itself to). The 7B shape at Qwen2.5's vocabulary with random bf16
weights made on the GPU (no files); host memory pinned in threads as a job sets it, before CUDA initialises.
What `eps-screen validate` counts per job that starts the off-policy engine (figures.json start/base-aside: the first
round, as a job sets its base aside once; measured 2026-12-05, BENCHMARKS.md).

    python3 benchmarks/base_aside_bench.py --name base_aside_h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="aside and back, this many times (the first pins memory)")
    ap.add_argument("--name", default="base_aside.json")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()

    from eps_screen.run import engines

    engines.pin_host_memory_in_threads()  # read when CUDA initialises: first, as in a job
    import torch

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")

    from benchmarks.gpu_common import QWEN7B_SHAPE, build_model, environment
    from eps_screen.models import loading as models

    ref, dtype, attn = "qwen7b-shape", "bfloat16", "sdpa"
    # Registered as load_base would have loaded it: the weights are made here, not read from a directory.
    models._LOADED[(ref, dtype, attn, None)] = models.BaseModel(ref, build_model(vocab=QWEN7B_SHAPE["vocab_size"]), None)
    torch.cuda.synchronize()
    gib = 2**30
    rounds = []
    for i in range(args.rounds):
        free_before = torch.cuda.mem_get_info()[0] / gib
        t = time.perf_counter()
        moved = models.bases_to_host()
        aside_s = time.perf_counter() - t
        free_aside = torch.cuda.mem_get_info()[0] / gib
        t = time.perf_counter()
        base = models.load_base(ref, dtype, attn)
        torch.cuda.synchronize()
        back_s = time.perf_counter() - t
        assert next(base.model.parameters()).is_cuda
        rounds.append({"moved_gib": moved / gib, "to_host_s": aside_s, "back_s": back_s, "free_before_gib": free_before,
                       "free_aside_gib": free_aside, "free_back_gib": torch.cuda.mem_get_info()[0] / gib})
        r = rounds[-1]
        print(f"round {i + 1}: {r['moved_gib']:.2f} GiB to host {aside_s:.2f} s, back {back_s:.2f} s; free "
              f"{free_before:.1f} -> {free_aside:.1f} -> {r['free_back_gib']:.1f} GiB", flush=True)
    out = Path(args.out) / args.name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"environment": environment(), "command": " ".join(["python3", *sys.argv]),
                               "rounds": rounds}, indent=1))
    print(out)


if __name__ == "__main__":
    main()
