"""Shared pieces of the GPU benchmarks: the 7B-shaped random model, the environment record, result files.

The model has Qwen2.5-7B-Instruct's shapes (hidden 3584, 28 layers, 28 heads, 4 KV heads, intermediate 18944,
vocab 152064) and random weights: nothing is downloaded, and throughput depends on shapes, not on weights.
It is built on the GPU directly, in bf16 (a CPU init of 7.6B parameters takes minutes).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

QWEN7B_SHAPE = dict(
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
# The tiny shape stands in for it on a CPU dry run (--tiny): the same code paths in seconds.
TINY_SHAPE = dict(QWEN7B_SHAPE, vocab_size=2048, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
H200_BF16_PEAK = 989e12  # dense bf16 FLOP/s of the H100/H200 datasheet: the MFU denominator
DATE = "2026-11-30"


def build_model(tiny: bool = False, layers: int | None = None, attn: str = "sdpa"):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    shape = dict(TINY_SHAPE if tiny else QWEN7B_SHAPE)
    if layers:
        shape["num_hidden_layers"] = layers
    config = Qwen2Config(**shape)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    model.eval()
    return model


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def environment() -> dict:
    import torch

    versions = {}
    for lib in ("torch", "transformers", "peft", "trl", "accelerate", "datasets", "liger-kernel", "triton", "flash-attn"):
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    gpu = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        gpu = {"name": p.name, "memory_gb": round(p.total_memory / 2**30, 1), "sms": p.multi_processor_count}
    return {
        "date": DATE,
        "run_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "python": platform.python_version(),
        "host": platform.node(),
        "gpu": gpu,
        "versions": versions,
    }


def out_dir(default: str = "benchmarks/results") -> Path:
    """$OUT on the device machine (files there come back), else benchmarks/results."""
    path = Path(os.environ.get("OUT") or default)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    tmp.replace(path)
