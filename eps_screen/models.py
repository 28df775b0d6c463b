"""Loading base models and tokenizers: hub ids, local paths, or the locally built tiny variants."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from eps_screen.tinymodel import is_tiny, tiny_model_path


def resolve(ref: str) -> str:
    """A path or hub id that transformers and vLLM can load (tiny variants are built on first use)."""
    return str(tiny_model_path(ref)) if is_tiny(ref) else ref


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_dtype(name: str):
    import torch

    # bf16 on a CPU without native support is slow and drifts; the tiny model is float32 by design.
    if device() == "cpu" and name != "float32":
        return torch.float32
    return getattr(torch, name)


@lru_cache(maxsize=4)
def load_tokenizer(ref: str, revision: str | None = None):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve(ref), revision=revision)
    tok.padding_side = "left"  # decoder-only batched generation needs left padding
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


@dataclass
class BaseModel:
    """A loaded base model with its tokenizer; kept alive across cells of one process."""

    ref: str
    model: Any
    tokenizer: Any


_LOADED: dict[tuple, BaseModel] = {}


def load_base(ref: str, dtype: str = "float32", attn: str = "sdpa", revision: str | None = None) -> BaseModel:
    """Load once per process: a GPU unit of work runs several cells against the same base weights."""
    key = (ref, dtype, attn, revision)
    if key not in _LOADED:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            resolve(ref), revision=revision, dtype=torch_dtype(dtype), attn_implementation=attn
        ).to(device())
        model.eval()
        _LOADED[key] = BaseModel(ref, model, load_tokenizer(ref, revision))
    return _LOADED[key]
