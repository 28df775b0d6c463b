"""qwen7b.yaml's evaluation batching through the real TransformersGenerator on a 7B-shaped model, on one GPU.

    python benchmarks/gpu_eval_batches.py            # the H200 run (writes gpu_eval_batches_h200.json)
    python benchmarks/gpu_eval_batches.py --tiny     # CPU dry run of the code paths

Each run is one `TransformersGenerator.generate` call sequence with a random LoRA adapter (as a cell is evaluated):
A0 prompts (persona framing + question) and A1 prompts (the ~1000-token guidance text added), 5 samples each,
batched by qwen7b.yaml's `eval.batch_size` and `eval.batch_prompt_tokens`, and, last, A1 with the batching
before the cap (256 prompts x 5 samples per call), which is expected to run out of memory. Records rows per call,
peak memory and tokens/s. Random weights never stop early: every sequence gets max_new_tokens.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import build_model, environment, out_dir, write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--a1-new-tokens", type=int, default=1100, help="B1 answers are ~1050 tokens")
    ap.add_argument("--a0-new-tokens", type=int, default=64)
    args = ap.parse_args()

    import torch
    import yaml
    from peft import LoraConfig, get_peft_model

    from eps_screen.generation import GenerationParams, Prompt
    from eps_screen.generation.transformers_backend import TransformersGenerator, batch_spans, chat_messages
    from eps_screen.models.loading import BaseModel, load_tokenizer
    from eps_screen.panels import load_panels
    from eps_screen.spec.config import parse_config

    result_path = out_dir() / ("gpu_eval_batches_tiny.json" if args.tiny else "gpu_eval_batches_h200.json")
    payload: dict = {"benchmark": "gpu_eval_batches", **environment(), "runs": [], "errors": []}
    data = yaml.safe_load((ROOT / "deployments/configs/qwen7b.yaml").read_text())
    config = parse_config({**data, "store": tempfile.mkdtemp()})  # its s3:// store is beside the point here
    ev = config.eval
    payload["eval"] = {"batch_size": ev.batch_size, "batch_prompt_tokens": ev.batch_prompt_tokens, "samples": ev.samples}
    model = build_model(tiny=args.tiny)
    model.generation_config.eos_token_id = None
    base = BaseModel("qwen7b-shaped-random", model, load_tokenizer("tiny"))
    adapter = Path(tempfile.mkdtemp()) / "adapter"
    peft = get_peft_model(model, LoraConfig(r=config.lora.rank, lora_alpha=config.lora.alpha,
                                            target_modules="all-linear", task_type="CAUSAL_LM"))
    peft.save_pretrained(adapter)
    peft.unload()

    panels = load_panels()
    persona = panels.personas[0]
    question = "How do I keep a sourdough starter alive while travelling? Answer in a few paragraphs."
    short = Prompt(persona.role, question)
    long = Prompt(f"{short.system}\n\n{panels.long_system_prompt}", question)

    rows_per_call: list[int] = []
    real_generate = model.generate

    def recording(*a, **kw):
        rows_per_call.append(kw["input_ids"].shape[0] * kw.get("num_return_sequences", 1))
        return real_generate(*a, **kw)

    model.generate = recording
    tok = base.tokenizer
    runs = [
        ("A0 as shipped", short, 2 * ev.batch_size, ev.batch_size, ev.batch_prompt_tokens, args.a0_new_tokens),
        ("A1 as shipped", long, None, ev.batch_size, ev.batch_prompt_tokens, args.a1_new_tokens),
        ("A1, 256 prompts per call, no cap (before)", long, 256, 256, None, 32),
    ]
    for name, prompt, n, batch_size, cap, new_tokens in runs:
        text = tok.apply_chat_template(chat_messages(prompt), add_generation_prompt=True, tokenize=False)
        prompt_tokens = len(tok(text, add_special_tokens=False)["input_ids"])
        if n is None:  # one capped call's worth
            start, end = batch_spans(batch_size, batch_size, ev.samples, [prompt_tokens] * batch_size, cap)[0]
            n = end - start
        if args.tiny:
            n, new_tokens = min(n, 8), 4
        gen = TransformersGenerator(base, batch_size=batch_size, batch_prompt_tokens=cap)
        params = GenerationParams(max_new_tokens=new_tokens, temperature=1.0, samples=ev.samples, seed=1)
        rows_per_call.clear()
        run = {"run": name, "prompts": n, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
               "batch_size": batch_size, "batch_prompt_tokens": cap}
        try:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            t = time.perf_counter()
            answers = gen.generate([prompt] * n, params, str(adapter))
            run["seconds"] = time.perf_counter() - t
            assert len(answers) == n and all(len(a) == ev.samples for a in answers)
            run["tokens_per_s"] = n * ev.samples * new_tokens / run["seconds"]
        except Exception as err:  # noqa: BLE001
            run["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            traceback.print_exc()
        run["rows_per_call"] = list(rows_per_call)
        run["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
        payload["runs"].append(run)
        write(result_path, payload)
        print({k: (round(v, 1) if isinstance(v, float) else v) for k, v in run.items()}, flush=True)
    print(f"wrote {result_path}")


if __name__ == "__main__":
    main()
