"""Attention for padding-free training batches: packed sequences through PyTorch's own flash-attention varlen kernel.
A batch with shared prefixes (eps_screen.train.prefix) also names each segment's keys (KV_INDEX): a suffix's
keys are its prefix's and its own, gathered before the kernel, which masks causally from the bottom right.

Training (eps_screen.train.lora, eps_screen.train.together) switches a loaded sdpa model to `eps_varlen` for its
length with `use_varlen_attention`: packed rows (cu_seq_lens_q in the attention kwargs) go through
torch.nn.attention.varlen on CUDA, or one sequence at a time through sdpa elsewhere; anything else (padded batches,
generation with a KV cache) through sdpa unchanged. Only training uses it.
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any

from eps_screen.train.prefix import KV_INDEX

VARLEN_ATTENTION = "eps_varlen"


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


def _matches_reference(q_bounds: list[int], k_bounds: list[int], gqa_native: bool) -> bool:
    """Whether the GPU kernel, forward and backward, gives the reference's attention on random packed sequences
    (bounds: where each sequence's queries and keys start and end); any failure is a no."""
    import torch

    try:
        torch.manual_seed(0)
        q = torch.randn(q_bounds[-1], 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(k_bounds[-1], 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(k_bounds[-1], 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        cu_q, cu_k = (torch.tensor(b, device="cuda", dtype=torch.int32) for b in (q_bounds, k_bounds))
        longest = [max(b - a for a, b in zip(x[:-1], x[1:], strict=True)) for x in (q_bounds, k_bounds)]
        out = _varlen_call(q, k, v, cu_q, cu_k, *longest, None, gqa_native=gqa_native)
        out.float().square().sum().backward()
        ref = _varlen_reference(q.detach().float(), k.detach().float(), v.detach().float(), cu_q, None, cu_k)
        ok = float((out.detach().float() - ref).norm() / ref.norm()) < 2e-2 and k.grad is not None
        return bool(ok and torch.isfinite(k.grad).all())
    except Exception:  # noqa: BLE001 - the caller falls back to what it can trust
        return False


def _probe_gqa() -> bool:
    """Whether the kernel takes 2 KV heads for 4 query heads as they are (else they are repeated)."""
    import torch

    if _varlen_kernel() is None or not torch.cuda.is_available():
        return False
    return _matches_reference([0, 20, 48], [0, 20, 48], gqa_native=True)


_KERNEL: tuple | None = None  # _varlen_kernel(), resolved once outside any torch.compile trace


@lru_cache(maxsize=1)
def prefix_keys_supported() -> bool:
    """Whether the attention takes sequences with more keys than queries, causal from the bottom right (a suffix
    that sees its shared prefix; eps_screen.train.prefix): always on the reference path, probed once on the GPU
    against it, forward and backward (else training goes without shared prefixes)."""
    import torch

    if _varlen_kernel() is None or not torch.cuda.is_available():
        return True
    # 16 prefix queries seeing their 16 keys, then 24 suffix queries seeing 30 keys before them and their own 24
    return _matches_reference([0, 16, 40], [0, 16, 70], gqa_native=_GQA_NATIVE)


def _varlen_call(q, k, v, cu_q, cu_k, max_q, max_k, scale: float | None, gqa_native: bool | None = None):
    """Causal attention over packed sequences; q (T, H, D), k and v (T, Hkv, D)."""
    import torch

    kernel = _KERNEL if _KERNEL is not None else _varlen_kernel()
    if kernel is None or not q.is_cuda:
        return _varlen_reference(q, k, v, cu_q, scale, cu_k)
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


def _varlen_reference(q, k, v, cu_q, scale: float | None, cu_k=None):
    """The same function, one sequence at a time through sdpa (CPU, tests, and torch without varlen). A sequence
    with more keys than queries (a suffix that also sees its shared prefix) is causal from the bottom right, as
    the flash kernel's mask is: query j sees the keys up to j + (keys - queries)."""
    import torch
    import torch.nn.functional as F

    rep = q.shape[1] // k.shape[1]
    outs = []
    bq = cu_q.tolist()
    bk = bq if cu_k is None else cu_k.tolist()
    for lo, hi, klo, khi in zip(bq[:-1], bq[1:], bk[:-1], bk[1:], strict=True):
        qs = q[lo:hi].transpose(0, 1)
        ks = k[klo:khi].transpose(0, 1).repeat_interleave(rep, dim=0)
        vs = v[klo:khi].transpose(0, 1).repeat_interleave(rep, dim=0)
        lq, lk = hi - lo, khi - klo
        if lq == lk:
            out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)
        else:
            seen = torch.arange(lk, device=q.device)[None, :] <= torch.arange(lq, device=q.device)[:, None] + (lk - lq)
            out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=seen, scale=scale)
        outs.append(out.transpose(0, 1))
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
    kv_index = kwargs.get(KV_INDEX)
    if kv_index is not None:  # shared prefixes (eps_screen.train.prefix): each segment's keys, gathered
        k = k.index_select(0, kv_index)
        v = v.index_select(0, kv_index)
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
