"""Where a training step with shared prefixes spends its time: one A1B0 cell of qwen7b.yaml (micro-batch of 8,
~27% of its tokens shared), trained alone through train_lora, compiled, on the 7B-shaped model.

    EPS_SCREEN_CACHE=.eps-cache python3 benchmarks/gpu_prefix_bench.py --steps 14 --gather32
    EPS_SCREEN_CACHE=.eps-cache python3 benchmarks/gpu_prefix_bench.py --steps 14 --conditions A1B0,A1B1 --unsplit --no-profile

Variants, one process: `plain` (share_prefix off), `gather` (the product: keys and values gathered by index in
bf16), `gather32` (the gather in float32: its backward, an index_add, then accumulates in float32), `-17k` (A1B1's
batch of 8 in one pass), each with the number of graphs torch.compile made; then a profile of a few `gather`
steps, its costliest kernels printed.
Writes gpu_prefix_bench.json ($OUT on the device, else benchmarks/results).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import environment, job_config, out_dir, write  # noqa: E402
from gpu_full_size_train import capped, condition_cells, load_base, training_set  # noqa: E402


def _gather32(module, query, key, value, attention_mask, **kwargs):
    """The product's attention with the key/value gather done in float32."""
    from eps_screen.train import attention as ta

    index = kwargs.pop(ta.KV_INDEX, None)
    if index is not None:
        k = key[0].transpose(0, 1).float().index_select(0, index).to(key.dtype)
        v = value[0].transpose(0, 1).float().index_select(0, index).to(value.dtype)
        key, value = k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    return ta.varlen_attention_forward(module, query, key, value, attention_mask, **kwargs)


def train(base, config, examples, root: Path) -> dict:
    import torch._dynamo

    from eps_screen.train.lora import train_lora

    ends = []
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    started = time.perf_counter()
    report = train_lora(base, examples, config, True, 42, root, on_step=lambda s, v: ends.append(time.perf_counter()))
    steady = (ends[-1] - ends[1]) / (len(ends) - 2)
    return {"steps": len(ends), "s_per_step": steady, "seconds": time.perf_counter() - started,
            "tokens": report.tokens, "computed_tokens": report.computed_tokens,
            "new_graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs,
            "peak_allocated_gb": report.peak_allocated_gb}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--conditions", default="A1B0", help="A x B conditions, comma-separated (one E1 cell each)")
    ap.add_argument("--unsplit", action="store_true", help="also max_batch_tokens 17000 (A1B1's batch in one pass)")
    ap.add_argument("--gather32", action="store_true", help="also the float32 gather (measured slower: recompiles)")
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    import torch
    from transformers import AttentionInterface

    from eps_screen.train.attention import VARLEN_ATTENTION, register_varlen_attention, varlen_attention_forward

    base, built = load_base(args.tiny)
    model_dir = Path(tempfile.mkdtemp())
    (model_dir / "config.json").write_text("{}")
    result = {"environment": environment(), "runs": {}}
    path = out_dir() / "gpu_prefix_bench.json"
    with tempfile.TemporaryDirectory() as tmp:
        def config(**overrides):
            return job_config(model_dir, Path(tmp) / "store", reduced=False, overrides=overrides)

        plain, shared = config(**{"training.share_prefix": False}), config()
        register_varlen_attention()
        # Each variant twice, the second after the others: a process's first runs of a new shape or new keyword
        # recompile inside their measured steps; the "-again" runs are the steady figures.
        variants = [("plain", plain, varlen_attention_forward), ("gather", shared, varlen_attention_forward)]
        if args.gather32:
            variants.append(("gather32", shared, _gather32))
        if args.unsplit:
            variants += [("plain-17k", config(**{"training.share_prefix": False, "training.max_batch_tokens": 17000}),
                          varlen_attention_forward),
                         ("gather-17k", config(**{"training.max_batch_tokens": 17000}), varlen_attention_forward)]
        for condition in args.conditions.split(","):
            cell = condition_cells(shared, int(condition[1]), int(condition[3]))[0]
            examples = capped(shared, training_set(shared, cell, base.tokenizer), args.steps, cell.id)
            for name, cfg, attention in variants + [(f"{n}-again", c, a) for n, c, a in variants if n != "gather32"]:
                AttentionInterface.register(VARLEN_ATTENTION, attention)
                key = f"{condition}:{name}"
                result["runs"][key] = train(base, cfg, examples, Path(tmp) / key.replace(":", "-"))
                print(key, result["runs"][key], flush=True)
                write(path, result)
        AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)
        if args.no_profile:
            write(path, result)
            return
        few = capped(shared, examples, 3, "profile")
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                              if torch.cuda.is_available() else [])
        with torch.profiler.profile(activities=activities) as prof:
            train(base, shared, few, Path(tmp) / "profiled")
        key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=key, row_limit=18, max_name_column_width=70)
        print(table)
        result["profile_top"] = table
    write(path, result)


if __name__ == "__main__":
    main()
