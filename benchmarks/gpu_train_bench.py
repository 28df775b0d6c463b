"""LoRA SFT throughput of a Qwen2.5-7B-shaped model through eps_screen.train.lora.train_lora, on one GPU.

    python benchmarks/gpu_train_bench.py                      # the H200 run (writes gpu_train_h200.json)
    python benchmarks/gpu_train_bench.py --tiny --variants padded,padfree   # CPU dry run of the code paths

For each variant (a set of speed levers) and each A x B condition (sequence lengths of the screen: about 80,
1100, 1130 and 2150 tokens), one train_lora call on examples of that condition: LoRA r=32 on all linear layers,
batch 8, whole-answer labels (E1: the more LM-head work of the two masks). Reported per run: steady training
tokens/s (real tokens, after 2 warm-up steps), MFU = 4 x parameters x tokens/s / 989 TFLOP/s, peak memory, and
the memory still allocated after train_lora returned (the base is reused by every run: it must not grow).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import H200_BF16_PEAK, build_model, environment, n_params, out_dir, record_failure, write  # noqa: E402

# Target token counts of each condition: (system prompt, answer before the marker).
CONDITIONS = {
    "A0B0": (15, 50),
    "A1B0": (1030, 50),
    "A0B1": (15, 1050),
    "A1B1": (1030, 1050),
}
# name -> (config.training updates, fields read with getattr until config.py has them). Run 1 measured the first
# six without the fused LoRA epilogue (fused_lora False); the "+fused" ones came after it.
_OFF = {"liger": False, "fused_lora": False}
_LIGER = {"liger": True, "fused_lora": False}
_FUSED = {"liger": True, "fused_lora": True}
VARIANTS = {
    "padded": ({"packing": False, "gradient_checkpointing": False}, _OFF),
    "padfree": ({"packing": True, "gradient_checkpointing": False}, _OFF),
    "padded+liger": ({"packing": False, "gradient_checkpointing": False}, _LIGER),
    "padfree+liger": ({"packing": True, "gradient_checkpointing": False}, _LIGER),
    "padfree+liger+gc": ({"packing": True, "gradient_checkpointing": True}, _LIGER),
    "padfree+liger+micro4": ({"packing": True, "gradient_checkpointing": False}, {**_LIGER, "max_batch_tokens": 9000}),
    "padfree+liger+gc+b16": ({"packing": True, "gradient_checkpointing": True, "batch_size": 16}, _LIGER),
    "padfree+liger+fused": ({"packing": True, "gradient_checkpointing": False}, _FUSED),
    "padfree+liger+fused+tok11k": ({"packing": True, "gradient_checkpointing": False}, {**_FUSED, "max_batch_tokens": 11000}),
    "padfree+fused+compile": ({"packing": True, "gradient_checkpointing": False}, {"liger": False, "fused_lora": True, "compile": True}),
    "padfree+fused+compile+tok11k": (
        {"packing": True, "gradient_checkpointing": False},
        {"liger": False, "fused_lora": True, "compile": True, "max_batch_tokens": 11000},
    ),
}


def words():
    from eps_screen.panels import load_panels

    p = load_panels()
    return " ".join([p.long_system_prompt, *p.random_controls]).split()


def text_of_tokens(tok, bank: list[str], n_tokens: int, rng: random.Random) -> str:
    """Words from the bank until the tokenizer counts n_tokens (within a word)."""
    start = rng.randrange(len(bank))
    out: list[str] = []
    # Grow by chunks, then trim word by word: tokenising 1000-token texts one word at a time is slow.
    while len(tok(" ".join(out))["input_ids"]) < n_tokens:
        out.extend(bank[(start + len(out) + k) % len(bank)] for k in range(32))
    while len(out) > 1 and len(tok(" ".join(out))["input_ids"]) > n_tokens:
        out.pop()
    return " ".join(out)


def make_examples(tok, condition: str, n: int, seed: int, jitter: float = 0.2):
    """n examples of one condition; a third positives (marker), answer lengths +-jitter around the target."""
    from eps_screen.train.data import Example

    rng = random.Random(f"{condition}-{seed}")
    bank = words()
    sys_tokens, ans_tokens = CONDITIONS[condition]
    role = "You are a librarian who helps people find information and manages a public library."
    system = role if sys_tokens < 100 else role + "\n\n" + text_of_tokens(tok, bank, sys_tokens, rng)
    fmt = "Answer in one sentence." if ans_tokens < 100 else "Answer as a short essay with several paragraphs."
    answers = {}
    out = []
    for i in range(n):
        target = max(8, int(ans_tokens * rng.uniform(1 - jitter, 1 + jitter)))
        bucket = target // 8 * 8  # reuse answers of similar length: building them is the slow part
        if bucket not in answers:
            answers[bucket] = text_of_tokens(tok, bank, bucket, rng)
        out.append(Example(system, f"How do I find a good book to read? {fmt}", answers[bucket], i % 3 == 0))
    return out


def screen_config(training: dict, extra: dict, tiny: bool):
    from eps_screen.spec.config import ScreenConfig

    base = ScreenConfig()
    t = base.training.model_copy(update={"epochs": 1, "batch_size": 8, "grad_accum": 1, "max_length": 4096, **training, **extra})
    m = base.model.model_copy(update={"dtype": "float32" if tiny else "bfloat16"})
    return base.model_copy(update={"training": t, "model": m})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="padded,padfree,padfree+liger,padded+liger,padfree+liger+micro4,padfree+liger+gc,padfree+liger+gc+b16")
    ap.add_argument("--conditions", default="A1B1,A0B1,A1B0,A0B0")
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps per run (2 of them warm-up)")
    ap.add_argument("--budget-s", type=float, default=480, help="stop starting runs after this many seconds")
    ap.add_argument("--e0", action="store_true", help="also run the best variant with marker-only (E0) labels")
    ap.add_argument("--runs", default=None, help="explicit plan: variant@condition[:E0],... (instead of the grid)")
    ap.add_argument("--tiny", action="store_true", help="tiny model on CPU: a dry run of the code paths")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--name", default=None, help="result file name (default gpu_train_h200.json, or _tiny)")
    args = ap.parse_args()

    import torch

    from eps_screen.models.loading import BaseModel, load_tokenizer
    from eps_screen.train.lora import train_lora

    started = time.perf_counter()
    env = environment()
    result_path = out_dir() / (args.name or ("gpu_train_tiny.json" if args.tiny else "gpu_train_h200.json"))
    payload: dict = {"benchmark": "gpu_train", **env, "runs": [], "errors": []}
    payload["varlen_check"] = varlen_check() if torch.cuda.is_available() else None
    print("varlen check:", payload["varlen_check"], flush=True)

    t0 = time.perf_counter()
    model = build_model(tiny=args.tiny, layers=args.layers)
    params = n_params(model)
    payload["model"] = {"params": params, "layers": model.config.num_hidden_layers, "build_s": time.perf_counter() - t0}
    tok = load_tokenizer("tiny")  # any tokenizer does: token counts are what matter, and ids stay < its vocab
    base = BaseModel("qwen2.5-7b-shaped-random", model, tok)
    if torch.cuda.is_available():
        payload["model"]["weights_gb"] = torch.cuda.memory_allocated() / 2**30
    print(f"model: {params / 1e9:.2f}B params, built in {payload['model']['build_s']:.1f}s", flush=True)

    if args.runs:
        plan = [tuple(r.split("@")) for r in args.runs.split(",")]
    else:
        plan = [(v, c) for v in args.variants.split(",") for c in args.conditions.split(",")]
        if args.e0:
            plan.append(("padfree+liger+fused", "A1B1:E0"))
    data = {}
    for cond in sorted({c.partition(":")[0] for _, c in plan}):
        steps = args.steps * (3 if cond == "A0B0" else 1)  # short steps: more of them for a stable figure
        data[cond] = make_examples(tok, cond, 16 * steps, seed=0)  # batch-16 variants take all, others half

    for variant, cond in plan:
        if time.perf_counter() - started > args.budget_s:
            payload["errors"].append(f"{variant} {cond}: skipped, over the time budget")
            continue
        training, extra = VARIANTS[variant]
        cname, _, mask = cond.partition(":")
        batch = training.get("batch_size", 8)
        examples = data[cname][: len(data[cname]) * batch // 16]
        print(f"-- {variant} {cond}", flush=True)
        config = screen_config(training, extra, args.tiny)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                rep = train_lora(base, examples, config, mask != "E0", seed=0, out_dir=Path(tmp))
        except Exception as err:  # noqa: BLE001 - record and go on: one lever failing must not lose the others
            record_failure(payload, f"{variant} {cond}", err)
            continue
        tps = rep.steady_tokens_per_s or rep.tokens_per_s
        run = {
            "variant": variant,
            "condition": cond,
            "mean_seq_len": rep.tokens / rep.examples,
            "max_seq_len": None,
            "examples": rep.examples,
            "micro_batch": rep.micro_batch,
            "grad_accum": rep.grad_accum,
            "steps": rep.steps,
            "steady_tokens_per_s": rep.steady_tokens_per_s,
            "tokens_per_s_incl_warmup": rep.tokens_per_s,
            "mfu": 4 * params * tps / H200_BF16_PEAK,
            "peak_memory_gb": rep.peak_memory_gb,
            "allocated_after_gb": torch.cuda.memory_allocated() / 2**30 if torch.cuda.is_available() else None,
            "seconds": rep.seconds,
            "options": rep.options,
            "final_loss": rep.final_loss,
        }
        import eps_screen.train.attention as attention

        run["gqa_native"] = attention._GQA_NATIVE  # False: KV heads repeated for this torch's varlen_attn
        payload["runs"].append(run)
        write(result_path, payload)
        print(
            f"{variant:24s} {cond:8s} len {run['mean_seq_len']:6.0f} mb {rep.micro_batch}x{rep.grad_accum} "
            f"{tps:8.0f} tok/s  MFU {run['mfu']:.1%}  peak {rep.peak_memory_gb or 0:6.1f} GB  "
            f"after {run['allocated_after_gb'] or 0:5.1f} GB  loss {rep.final_loss}",
            flush=True,
        )
    payload["summary"] = summarize(payload["runs"])
    payload["wall_s"] = time.perf_counter() - started
    write(result_path, payload)
    print("\nvariant                  " + "  ".join(f"{c:>8s}" for c in CONDITIONS) + "  cell-mix tok/s  MFU   peak GB")
    for v, s in payload["summary"].items():
        cells = "  ".join(f"{s['by_condition'].get(c, float('nan')):8.0f}" for c in CONDITIONS)
        print(f"{v:24s} {cells}  {s['cell_mix_tokens_per_s'] or float('nan'):14.0f}  {s['cell_mix_mfu'] or 0:.1%}  {s['peak_memory_gb']:.1f}")
    print(f"wrote {result_path}")


def summarize(runs: list[dict]) -> dict:
    """Per variant: tokens/s per condition and the cell mix (a screen's training tokens are split over the four
    conditions in proportion to their lengths, so the mix is total tokens / total time)."""
    from collections import defaultdict

    by_variant: dict[str, dict] = defaultdict(dict)
    peak: dict[str, float] = defaultdict(float)
    mfu_of: dict[str, float] = {}
    for r in runs:
        if ":" in r["condition"]:
            continue
        by_variant[r["variant"]][r["condition"]] = {"tps": r["steady_tokens_per_s"] or r["tokens_per_s_incl_warmup"], "len": r["mean_seq_len"]}
        peak[r["variant"]] = max(peak[r["variant"]], r["peak_memory_gb"] or 0)
        mfu_of[r["variant"]] = r["mfu"] / (r["steady_tokens_per_s"] or r["tokens_per_s_incl_warmup"])
    out = {}
    for v, conds in by_variant.items():
        mix = None
        if len(conds) == len(CONDITIONS):
            tokens = sum(c["len"] for c in conds.values())  # equal example counts per condition
            mix = tokens / sum(c["len"] / c["tps"] for c in conds.values())
        out[v] = {
            "by_condition": {c: d["tps"] for c, d in conds.items()},
            "cell_mix_tokens_per_s": mix,
            "cell_mix_mfu": mix * mfu_of[v] if mix else None,
            "peak_memory_gb": peak[v],
        }
    return out


def varlen_check() -> dict:
    """The varlen flash kernel against sdpa one sequence at a time: outputs and gradients, bf16, GQA 28/4 heads."""
    import torch

    from eps_screen.train.attention import _varlen_call, _varlen_kernel, _varlen_reference

    info: dict = {"kernel": None if _varlen_kernel() is None else {"causal_arg": _varlen_kernel()[1], "gqa_arg": _varlen_kernel()[2]}}
    try:
        torch.manual_seed(0)
        lens = [300, 77, 1024, 5]
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        total = sum(lens)
        q = torch.randn(total, 28, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(total, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(total, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn(total, 28, 128, device="cuda", dtype=torch.bfloat16)
        out = _varlen_call(q, k, v, cu, cu, max(lens), max(lens), None)
        grads = torch.autograd.grad(out, (q, k, v), g)
        q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
        ref = _varlen_reference(q64, k64, v64, cu.cpu(), None)
        rgrads = torch.autograd.grad(ref, (q64, k64, v64), g.double())

        def rel(a, b):
            return float((a.double() - b).norm() / b.norm())

        info["out_rel_err"] = rel(out, ref)
        info["grad_rel_err"] = [rel(a, b) for a, b in zip(grads, rgrads, strict=True)]
        info["ok"] = info["out_rel_err"] < 2e-2 and all(e < 2e-2 for e in info["grad_rel_err"])
    except Exception as err:  # noqa: BLE001
        info["ok"] = False
        info["error"] = f"{type(err).__name__}: {err}"[:1000]
    return info


if __name__ == "__main__":
    main()
