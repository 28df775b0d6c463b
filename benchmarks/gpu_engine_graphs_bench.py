"""What a SmolLM2 engine's start spends on CUDA graphs and on vLLM's lookup of the model's architecture, and what
fewer graph sizes cost its generation: each variant one vLLM engine, built as the product builds SmolLM2's (LoRA
r=32, 8 adapters, a 4 GiB KV cache, sleep mode, graphs to 1,024), in a process of its own.

    python3 benchmarks/gpu_engine_graphs_bench.py --base DIR [--name FILE] [--prompts N --tokens T]

DIR holds SmolLM2's config and tokenizer; random bf16 weights are made from them (a start and a decode step depend
on shapes, not on the weights' values). Variants, in this order:
  cold-default  an empty cache, vLLM's 83 graph sizes (eval.vllm_cudagraph_capture_sizes unset)
  warm-sizes    the same cache again (the compile and the architecture's facts cached), SIZES
                (eval.vllm_cudagraph_capture_sizes)
  warm-default  the same cache, vLLM's sizes
  cold-sizes    a second empty cache, the architecture's facts looked up first in a process of their own (as
                `eps-screen models prepare` does), then SIZES
A start is timed from the LLM() call to its return; the child's log gives vLLM's own parts. Then N prompts x T new
tokens (temperature 1, a seed per answer, as the product asks), through one adapter and through none: tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import environment, out_dir, write  # noqa: E402

SIZES = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 320, 384, 512, 640, 768, 1024]
VARIANTS = {"cold-default": ("a", None), "warm-sizes": ("a", SIZES), "warm-default": ("a", None),
            "cold-sizes": ("b", SIZES)}
# vLLM's log lines that name a part of the start, and the seconds each states
PARTS = {"compile_s": r"torch.compile took ([\d.]+) s in total", "graphs_s": r"Graph capturing finished in (\d+) secs",
         "init_s": r"init engine .* took ([\d.]+) s"}


def child(args) -> None:
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    graphs = {"max_cudagraph_capture_size": 1024}
    if args.sizes:
        graphs["cudagraph_capture_sizes"] = json.loads(args.sizes)
    t = time.perf_counter()
    llm = LLM(model=args.model, tokenizer=args.model, dtype="bfloat16", enable_lora=True, max_lora_rank=32,
              max_loras=8, max_cpu_loras=16, seed=0, gpu_memory_utilization=0.25,
              kv_cache_memory_bytes=4 * 2**30, enable_sleep_mode=True, compilation_config=graphs)
    out = {"start_s": round(time.perf_counter() - t, 1)}
    prompts = [f"Question {i}: what should a visitor know about topic number {i}?" for i in range(args.prompts)]
    for name, lora in (("lora", LoRARequest("a", 1, args.adapter)), ("none", None)):
        params = [SamplingParams(max_tokens=args.tokens, temperature=1.0, ignore_eos=True, seed=i)
                  for i in range(len(prompts))]
        t = time.perf_counter()
        done = llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
        seconds = time.perf_counter() - t
        tokens = sum(len(o.outputs[0].token_ids) for o in done)
        out[f"tokens_per_s_{name}"] = round(tokens / seconds)
    print("RESULT " + json.dumps(out), flush=True)


def facts(model: str, cache: Path) -> float:
    """Seconds a fresh process takes to look up the architecture's facts into `cache` (models prepare's step)."""
    code = "from vllm.config import ModelConfig; import sys; ModelConfig(model=sys.argv[1], tokenizer=sys.argv[1])"
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, model], env={**os.environ, "VLLM_CACHE_ROOT": str(cache)}, check=True,
                   capture_output=True)
    return round(time.perf_counter() - t, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base")
    ap.add_argument("--work", default="/tmp/graphs-bench")
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--name", default="gpu_engine_graphs.json")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--model")
    ap.add_argument("--adapter")
    ap.add_argument("--sizes")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    from gpu_smol_stage_bench import make_shaped_model

    work = Path(args.work)
    model, adapter = work / "model", work / "adapter"
    if not (model / "config.json").exists():
        make_shaped_model(Path(args.base), model)
    if not (adapter / "adapter_config.json").exists():
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16)
        torch.manual_seed(0)
        peft = get_peft_model(base, LoraConfig(r=32, lora_alpha=64, target_modules="all-linear",
                                               init_lora_weights="gaussian"))
        peft.save_pretrained(adapter)
    payload = {"environment": environment(), "sizes": SIZES, "prompts": args.prompts, "tokens": args.tokens,
               "runs": []}
    for variant in args.variants.split(","):
        cache_name, sizes = VARIANTS[variant]
        cache = work / f"cache-{cache_name}"
        run = {"variant": variant}
        if variant.startswith("cold") and sizes:
            run["facts_s"] = facts(str(model), cache)
        env = {**os.environ, "VLLM_CACHE_ROOT": str(cache), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
               "TRITON_CACHE_DIR": str(cache / "triton"), "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
               "VLLM_USE_FLASHINFER_SAMPLER": "0"}
        cmd = [sys.executable, __file__, "--child", "--model", str(model), "--adapter", str(adapter),
               "--prompts", str(args.prompts), "--tokens", str(args.tokens)]
        if sizes:
            cmd += ["--sizes", json.dumps(sizes)]
        t = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        run["process_s"] = round(time.perf_counter() - t, 1)
        log = proc.stdout + proc.stderr
        (work / f"{variant}.log").write_text(log)
        found = [line for line in log.splitlines() if line.startswith("RESULT ")]
        if found:
            run.update(json.loads(found[-1][len("RESULT "):]))
        else:
            run["error"] = log[-2000:]
        for key, pattern in PARTS.items():
            if m := re.search(pattern, log):
                run[key] = float(m.group(1))
        arch = re.search(r"(\d\d:\d\d:\d\d) \[[^]]*\] Enabling cumem allocator.*?\n.*?(\d\d:\d\d:\d\d) \[[^]]*\] Resolved "
                         r"architecture", log, re.S)
        if arch:
            a, b = ([int(x) for x in s.split(":")] for s in arch.groups())
            run["to_resolved_architecture_s"] = (b[0] - a[0]) * 3600 + (b[1] - a[1]) * 60 + b[2] - a[2]
        payload["runs"].append(run)
        print(json.dumps(run), flush=True)
        write(out_dir() / args.name, payload)  # after each variant: a call that runs out keeps what it measured


if __name__ == "__main__":
    main()
