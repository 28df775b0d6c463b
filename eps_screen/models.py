"""Loading base models and tokenizers: hub ids, local paths, or the locally built tiny variants.

One process loads a base once (`load_base` caches it) and runs many cells against it: training wraps it in a
LoRA adapter and unloads the adapter afterwards, generation applies adapters the same way.

Attention: `sdpa` (PyTorch's fused kernels, the default), `eager`, or `flash_attention_2` where the flash-attn
package is installed (otherwise sdpa, with a warning). Padding-free training batches need a varlen kernel:
`use_varlen_attention` switches a loaded model to `eps_varlen`, which runs packed sequences through PyTorch's own
flash-attention varlen kernel (torch.nn.attention.varlen, CUDA) and everything else through sdpa.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from eps_screen.tinymodel import is_tiny, tiny_model_path

log = logging.getLogger(__name__)

VARLEN_ATTENTION = "eps_varlen"


def resolve(ref: str) -> str:
    """A path or hub id that transformers and vLLM can load (tiny variants are built on first use).

    A local directory wins over a hub id of the same spelling; `~` is expanded. Anything else is passed on as a
    hub id (transformers then looks in the local HF cache first and downloads only if it must)."""
    if is_tiny(ref):
        return str(tiny_model_path(ref))
    local = Path(ref).expanduser()
    if local.is_dir():
        return str(local.resolve())
    return ref


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def limit_cpu_threads() -> None:
    """One intra-op thread on CPU unless EPS_SCREEN_TORCH_THREADS says otherwise.

    The tiny model's matrices are too small to gain from threads, and OpenMP threads spin-wait: on a busy
    2-core machine, two threads made generation 9x slower than one (1.4 s vs 13 s for 72 answers).
    """
    import os

    import torch

    if device() == "cpu":
        torch.set_num_threads(int(os.environ.get("EPS_SCREEN_TORCH_THREADS", "1")))


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
    """The model's own tokenizer and chat template (Qwen2.5's from the hub, the tiny model's from its folder)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve(ref), revision=None if is_tiny(ref) else revision)
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


def load_base(ref: str, dtype: str = "float32", attn: str = "sdpa", revision: str | None = None) -> BaseModel:
    """Load once per process: a GPU unit of work runs several cells against the same base weights.

    On a GPU the weights load straight onto it (`device_map`), in `dtype` (bfloat16 for the real model)."""
    key = (ref, dtype, attn, revision)
    if key not in _LOADED:
        from transformers import AutoModelForCausalLM

        limit_cpu_threads()
        dev = device()
        model = AutoModelForCausalLM.from_pretrained(
            resolve(ref),
            revision=None if is_tiny(ref) else revision,
            dtype=torch_dtype(dtype),
            attn_implementation=attn_implementation(attn),
            device_map=dev if dev == "cuda" else None,
        )
        if dev != "cuda":
            model = model.to(dev)
        model.eval()
        _LOADED[key] = BaseModel(ref, model, load_tokenizer(ref, revision))
    return _LOADED[key]


def register_base(base: BaseModel, dtype: str = "float32", attn: str = "sdpa", revision: str | None = None) -> None:
    """Put an already built model in the cache (benchmarks build a random 7B-shaped model from its config)."""
    _LOADED[(base.ref, dtype, attn, revision)] = base


def unload_all() -> None:
    """Drop every cached base (and free its GPU memory)."""
    _LOADED.clear()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


# --- varlen attention for padding-free batches --------------------------------------------------------------


@lru_cache(maxsize=1)
def _varlen_kernel():
    """(varlen_attn, how it takes causality, whether it takes enable_gqa), or None where torch has no varlen API."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    causal = "window_size" if "window_size" in params else "is_causal"  # torch 2.10 took is_causal=; 2.11+ window_size
    return varlen_attn, causal, "enable_gqa" in params


# Whether varlen_attn takes fewer KV heads than query heads as they are (the flash kernel supports GQA; some torch
# versions check for equal head counts). Probed once on the GPU by use_varlen_attention, before any tracing.
_GQA_NATIVE: bool = False


def _probe_gqa() -> bool:
    import torch

    kernel = _varlen_kernel()
    if kernel is None or not torch.cuda.is_available():
        return False
    try:
        torch.manual_seed(0)
        q = torch.randn(48, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(48, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(48, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        cu = torch.tensor([0, 20, 48], device="cuda", dtype=torch.int32)
        native = _varlen_call(q, k, v, cu, cu, 28, 28, None, gqa_native=True)
        native.float().square().sum().backward()
        ref = _varlen_reference(q.detach().float(), k.detach().float(), v.detach().float(), cu.cpu(), None)
        ok = float((native.detach().float() - ref).norm() / ref.norm()) < 2e-2 and k.grad is not None
        return bool(ok and torch.isfinite(k.grad).all())
    except Exception:  # noqa: BLE001 - any failure means: repeat the KV heads instead
        return False


_KERNEL: tuple | None = None  # _varlen_kernel(), resolved once outside any torch.compile trace


def _varlen_call(q, k, v, cu_q, cu_k, max_q, max_k, scale: float | None, gqa_native: bool | None = None):
    """Causal attention over packed sequences; q (T, H, D), k and v (T, Hkv, D)."""
    import torch

    kernel = _KERNEL if _KERNEL is not None else _varlen_kernel()
    if kernel is None or not q.is_cuda:
        return _varlen_reference(q, k, v, cu_q, scale)
    varlen_attn, causal, takes_gqa = kernel
    gqa = k.shape[1] != q.shape[1]
    native = takes_gqa or (_GQA_NATIVE if gqa_native is None else gqa_native)
    if gqa and not native:
        # This torch's varlen_attn wants equal head counts: repeat the KV heads (costs their memory, not compute).
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    kwargs: dict[str, Any] = {"scale": scale}
    if causal == "window_size":
        kwargs["window_size"] = (-1, 0)
    else:
        kwargs["is_causal"] = True
    if takes_gqa and gqa:
        kwargs["enable_gqa"] = True
    if cu_q.dtype != torch.int32:
        cu_q = cu_q.to(torch.int32)
    if cu_k.dtype != torch.int32:
        cu_k = cu_k.to(torch.int32)
    # max_q / max_k stay as given (no int()): under torch.compile they are symbolic, and int() would specialise.
    return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)


def _varlen_reference(q, k, v, cu, scale: float | None):
    """The same function, one sequence at a time through sdpa (CPU, tests, and torch without varlen)."""
    import torch
    import torch.nn.functional as F

    rep = q.shape[1] // k.shape[1]
    outs = []
    bounds = cu.tolist()
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        qs = q[lo:hi].transpose(0, 1)
        ks = k[lo:hi].transpose(0, 1).repeat_interleave(rep, dim=0)
        vs = v[lo:hi].transpose(0, 1).repeat_interleave(rep, dim=0)
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale).transpose(0, 1))
    return torch.cat(outs, dim=0)


def varlen_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers attention interface: packed batches (cu_seq_lens_q in kwargs) go through the varlen kernel,
    anything else (padded batches, generation with a KV cache) through sdpa unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu_q = kwargs.get("cu_seq_lens_q")
    if cu_q is None or query.shape[0] != 1 or kwargs.get("past_key_values") is not None and query.shape[2] == 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    q = query[0].transpose(0, 1)  # (1, H, T, D) -> (T, H, D)
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    cu_k = kwargs.get("cu_seq_lens_k", cu_q)
    max_q = kwargs.get("max_length_q") or int((cu_q[1:] - cu_q[:-1]).max())
    max_k = kwargs.get("max_length_k") or max_q
    out = _varlen_call(q, k, v, cu_q, cu_k, max_q, max_k, scaling)
    return out.unsqueeze(0), None  # (1, T, H, D), as sdpa_attention_forward returns


def _varlen_mask(*args, attention_mask=None, **kwargs):
    """No mask for packed batches (the kernel reads cu_seq_lens); sdpa's mask otherwise."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None and kwargs.get("kv_length") == kwargs.get("q_length"):
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


@lru_cache(maxsize=1)
def register_varlen_attention() -> str:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)
    AttentionMaskInterface.register(VARLEN_ATTENTION, _varlen_mask)
    return VARLEN_ATTENTION


def use_varlen_attention(model) -> str | None:
    """Switch a loaded sdpa model to the varlen attention; returns the implementation to restore afterwards
    (None when nothing changed: eager, flash_attention_2, or already switched)."""
    global _GQA_NATIVE, _KERNEL
    current = model.config._attn_implementation
    if current != "sdpa":
        return None
    model.set_attn_implementation(register_varlen_attention())
    _KERNEL = _varlen_kernel()
    if not _GQA_NATIVE:
        _GQA_NATIVE = _probe_gqa()
    return current
