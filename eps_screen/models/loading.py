"""Loading base models and tokenizers: hub ids, local paths, packaged or GGUF weights, or the locally built tiny
variants.

One process loads a base once (`load_base` caches it) and runs many cells against it: training wraps it in a
LoRA adapter and unloads the adapter afterwards, generation applies adapters the same way.

Attention: `sdpa` (PyTorch's fused kernels, the default), `eager`, or `flash_attention_2` where the flash-attn
package is installed (otherwise sdpa, with a warning). Training's padding-free batches switch a loaded model to a
varlen kernel for their length (eps_screen.train.attention).
"""

from __future__ import annotations

import gc

import importlib.util
import logging
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from eps_screen.models.cpu_process import prepare_cpu_process
from eps_screen.models.packaged import hf_dir, is_converted
from eps_screen.models.tiny import tiny_model_path
from eps_screen.spec.config import is_tiny

log = logging.getLogger(__name__)

def resolve(ref: str) -> str:
    """A path or hub id that transformers and vLLM can load (tiny variants are built, and packaged or GGUF weights
    converted, on first use: eps_screen.models.packaged).

    A local directory wins over a hub id of the same spelling; `~` is expanded. Anything else is passed on as a
    hub id (transformers then looks in the local HF cache first and downloads only if it must)."""
    if is_tiny(ref):
        return str(tiny_model_path(ref))
    if is_converted(ref):
        return str(hf_dir(ref))
    local = Path(ref).expanduser()
    if local.is_dir():
        return str(local.resolve())
    return ref


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_dtype(name: str):
    import torch

    # bf16 on a CPU without native support is slow and drifts; the tiny model is float32 by design.
    if device() == "cpu" and name != "float32":
        return torch.float32
    return getattr(torch, name)


def attn_implementation(requested: str) -> str:
    """The attention implementation to load with: flash_attention_2 only where flash-attn is installed."""
    if requested == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        log.warning("flash_attention_2 requested but flash-attn is not installed: using sdpa")
        return "sdpa"
    if requested == "flash_attention_2" and device() == "cpu":
        return "sdpa"
    return requested


@lru_cache(maxsize=4)
def load_tokenizer(ref: str, revision: str | None = None):
    """The model's own tokenizer and chat template (from the hub, a converted model's directory or the tiny model's)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve(ref), revision=None if is_tiny(ref) or is_converted(ref) else revision)
    if not tok.chat_template:
        raise ValueError(f"{ref}: the tokenizer has no chat template; eps-screen needs a chat model")
    tok.padding_side = "left"  # decoder-only batched generation needs left padding (TRL pads its batches itself)
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
# The loaded bases' moves to pinned host memory and back (bases_to_host, load_base), for a job's engine stats.
BASE_MOVES: dict[str, list[float]] = {"to_host_s": [], "to_host_gib": [], "back_s": []}


def load_base(ref: str, dtype: str = "float32", attn: str = "sdpa", revision: str | None = None) -> BaseModel:
    """Load once per process: a GPU unit of work runs several cells against the same base weights.

    On a GPU the weights load straight onto it (`device_map`), in `dtype` (bfloat16 for the real model)."""
    key = (ref, dtype, attn, revision)
    if key not in _LOADED:
        from transformers import AutoModelForCausalLM

        prepare_cpu_process()
        dev = device()
        model = AutoModelForCausalLM.from_pretrained(
            resolve(ref),
            revision=None if is_tiny(ref) or is_converted(ref) else revision,
            dtype=torch_dtype(dtype),
            attn_implementation=attn_implementation(attn),
            device_map=dev if dev == "cuda" else None,
        )
        if dev != "cuda":
            model = model.to(dev)
        model.eval()
        _LOADED[key] = BaseModel(ref, model, load_tokenizer(ref, revision))
        # The trainer runs full collections (three a cell), each walking every live object; the libraries and the
        # base model loaded by now live as long as the process, so they are left out of them: on the CPU a tiny
        # cell's collections took 0.6 s of its 3.5 before.
        gc.freeze()
    elif device() == "cuda" and not next(_LOADED[key].model.parameters()).is_cuda:
        started = time.perf_counter()
        _LOADED[key].model.to("cuda")  # set aside for another model's engine (bases_to_host): back for its work
        BASE_MOVES["back_s"].append(time.perf_counter() - started)
    return _LOADED[key]


def release_cached_memory() -> None:
    """Collect garbage, then give what the CUDA allocator holds free but cached back to the driver (a no-op where
    CUDA never initialised): another process, or an engine waking in this one, can use only what the driver has."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()


def bases_to_host() -> int:
    """Move the loaded bases' weights from the GPU into pinned host memory, so that an engine of another model in
    another process can have their share of the card; `load_base` moves them back. Returns the bytes moved."""
    import itertools

    import torch

    moved, started = 0, time.perf_counter()
    for base in _LOADED.values():
        for t in itertools.chain(base.model.parameters(), base.model.buffers()):
            if t.is_cuda:
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                host.copy_(t.data)
                t.data = host
                moved += host.numel() * host.element_size()
    if moved:
        torch.cuda.empty_cache()  # the freed blocks back to the driver: the other process sees them free
        BASE_MOVES["to_host_s"].append(time.perf_counter() - started)
        BASE_MOVES["to_host_gib"].append(moved / 2**30)
    return moved
