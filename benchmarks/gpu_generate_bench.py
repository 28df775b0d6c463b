"""Generation throughput of a Qwen2.5-7B-shaped model with transformers on one GPU, at the eval batch size.

    python benchmarks/gpu_generate_bench.py            # the H200 run (writes gpu_generate_h200.json)
    python benchmarks/gpu_generate_bench.py --tiny     # CPU dry run of the code paths

vLLM is the backend the screen uses on a GPU, but the H200 test machine has no vLLM (its wheel is too large to
carry), so this measures what transformers can do there: plain `generate` (dynamic KV cache), with a LoRA adapter
applied through PEFT (as TransformersGenerator evaluates a cell), at batch 256 and 512, with a static cache and
torch.compile, and transformers' continuous batching (`generate_batch`, paged attention). Every sequence is
forced to the same length (min_new_tokens), so tokens/s = batch x new tokens / wall time, sampling at T=1.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import build_model, environment, n_params, out_dir, record_failure, write  # noqa: E402

PROMPT_TOKENS = {"A0": 45, "A1": 1045}  # system + user + template tokens of the two A levels
VARIANTS = [
    # (name, prompt, batch, how)
    ("generate", "A0", 256, "plain"),
    ("generate", "A1", 256, "plain"),
    ("generate+lora", "A0", 256, "lora"),
    ("static-cache+compile", "A0", 256, "static"),
    ("generate", "A0", 512, "plain"),
    ("continuous-batching", "A0", 256, "cb"),
    ("static-cache+compile", "A1", 256, "static"),
    ("static-cache+compile+lora", "A0", 256, "static-lora"),
    ("static-cache+compile", "A0", 512, "static"),
    # larger eval batches (plain generate is bound by Python per decode step, so rows per step are nearly free)
    ("generate", "A0", 1024, "plain"),
    ("generate+lora", "A0", 1024, "lora"),
    ("generate", "A1", 1024, "plain"),
    ("generate+lora", "A1", 1024, "lora"),
    ("generate+lora", "A1", 256, "lora"),
    ("generate", "A0", 2048, "plain"),
    ("generate+lora", "A0", 2048, "lora"),
    ("generate", "A1", 512, "plain"),
    ("generate+lora", "A1", 512, "lora"),
]


def prompts(n: int, length: int, vocab: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab - 100, (n, length), generator=g)


def run_generate(model, ids, new_tokens: int, static: bool = False) -> float:
    import torch

    ids = ids.to(model.device)
    kwargs = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        pad_token_id=0,
        attention_mask=torch.ones_like(ids),
    )
    if static:
        kwargs["cache_implementation"] = "static"
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, **kwargs)
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    assert out.shape[1] == ids.shape[1] + new_tokens, out.shape
    return time.perf_counter() - t


def run_cb(model, ids, new_tokens: int) -> float:
    import torch
    from transformers import GenerationConfig

    gc = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True, temperature=1.0,
                          top_p=1.0, top_k=None, eos_token_id=-1, pad_token_id=0)
    inputs = [row.tolist() for row in ids]
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    t = time.perf_counter()
    out = model.generate_batch(inputs=inputs, generation_config=gc)
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    produced = sum(len(r.generated_tokens) for r in out.values())
    if produced != len(inputs) * new_tokens:
        raise RuntimeError(f"continuous batching produced {produced} tokens, expected {len(inputs) * new_tokens}")
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--only", default=None, help="comma list of variant names to run")
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--name", default=None)
    args = ap.parse_args()

    import torch

    started = time.perf_counter()
    result_path = out_dir() / (args.name or ("gpu_generate_tiny.json" if args.tiny else "gpu_generate_h200.json"))
    payload: dict = {"benchmark": "gpu_generate", **environment(), "new_tokens": args.new_tokens, "runs": [], "errors": []}
    model = build_model(tiny=args.tiny)
    model.generation_config.eos_token_id = None  # random weights: never stop early, every row gets new_tokens
    payload["model"] = {"params": n_params(model)}
    vocab = model.config.vocab_size
    only = set(args.only.split(",")) if args.only else None
    for name, prompt, batch, how in VARIANTS:
        if only and f"{name}@{prompt}@{batch}" not in only and name not in only:
            continue
        if time.perf_counter() - started > args.budget_s:
            payload["errors"].append(f"{name} {prompt} b{batch}: skipped, over the time budget")
            continue
        ids = prompts(batch, PROMPT_TOKENS[prompt] if not args.tiny else 20, vocab)
        new = args.new_tokens if not args.tiny else 8
        run = {"variant": name, "prompt": prompt, "prompt_tokens": ids.shape[1], "batch": batch, "new_tokens": new}
        try:
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            if how == "plain":
                run_generate(model, ids[:8], 4)  # warm-up: kernels, allocator
                run["seconds"] = run_generate(model, ids, new)
            elif how == "lora":
                from peft import LoraConfig, get_peft_model

                peft_model = get_peft_model(model, LoraConfig(r=32, lora_alpha=64, target_modules="all-linear", task_type="CAUSAL_LM"))
                try:
                    run_generate(peft_model, ids[:8], 4)
                    run["seconds"] = run_generate(peft_model, ids, new)
                finally:
                    peft_model.unload()
            elif how == "static-lora":
                from peft import LoraConfig, get_peft_model

                peft_model = get_peft_model(model, LoraConfig(r=32, lora_alpha=64, target_modules="all-linear", task_type="CAUSAL_LM"))
                try:
                    run["first_call_s"] = run_generate(peft_model, ids, new, static=True)
                    run["seconds"] = run_generate(peft_model, ids, new, static=True)
                finally:
                    peft_model.unload()
            elif how == "static":
                run["first_call_s"] = run_generate(model, ids, new, static=True)  # includes compilation
                run["seconds"] = run_generate(model, ids, new, static=True)
            elif how == "cb":
                run["first_call_s"] = run_cb(model, ids, new)
                run["seconds"] = run_cb(model, ids, new)
        except Exception as err:  # noqa: BLE001 - record and go on
            record_failure(payload, f"{name} {prompt} b{batch}", err)
            continue
        run["tokens_per_s"] = batch * new / run["seconds"]
        run["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
        payload["runs"].append(run)
        write(result_path, payload)
        print(f"{name:22s} {prompt} batch {batch:4d}: {run['tokens_per_s']:8.0f} tok/s  ({run['seconds']:.1f}s"
              + (f", first call {run['first_call_s']:.1f}s" if "first_call_s" in run else "") + ")", flush=True)
    payload["wall_s"] = time.perf_counter() - started
    write(result_path, payload)
    print(f"wrote {result_path}")


if __name__ == "__main__":
    main()
