"""Evaluate one adapter at the base model's speed: its LoRA update merged into the engine's weights for the call.

vLLM serves an adapter through extra LoRA kernels on every linear layer, which cost about a third of the base
model's throughput (BENCHMARKS.md, "The GPU job"). A cell's evaluation uses one adapter for all its requests, so
the update can instead be folded into the weights, W + (alpha/r) B A, as PEFT's merge does, and the requests run
as base-model requests. Afterwards the engine's weights are copied back from the training base that the same
process keeps (eps_screen.run.engines loads both from the same checkpoint and dtype), so the restore is exact, not a
subtraction in bf16. The prefix cache is dropped on each change: its KV entries were computed by other weights.

Qwen2/Llama-style decoders only (fused qkv_proj and gate_up_proj, o_proj, down_proj), one GPU (no tensor
parallelism); anything else raises MergeUnsupported before a weight is touched.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

_KEY = re.compile(r"layers\.(\d+)\.(self_attn|mlp)\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.lora_([AB])\.weight$")
# vLLM's fused modules and the Hugging Face projections stacked in them, in order.
FUSED = {
    ("self_attn", "qkv_proj"): ("q_proj", "k_proj", "v_proj"),
    ("self_attn", "o_proj"): ("o_proj",),
    ("mlp", "gate_up_proj"): ("gate_proj", "up_proj"),
    ("mlp", "down_proj"): ("down_proj",),
}


# The engine holds nearly all of the card (it sizes itself to what the training base leaves free): each update is
# computed a few MiB at a time on the GPU. Whole float32 deltas of a 7B model (~28 GB) ran out of memory there.
CHUNK_BYTES = 8 << 20


class MergeUnsupported(RuntimeError):
    pass


@dataclass(frozen=True)
class LoRAFactors:
    """A PEFT adapter's factors, {(layer, hf projection): (B, A)} in float32 on the CPU, and its alpha/r."""

    pairs: dict[tuple[int, str], tuple[object, object]]
    scale: float


def lora_factors(adapter_dir: str | Path) -> LoRAFactors:
    from safetensors.torch import load_file

    adapter_dir = Path(adapter_dir)
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    if cfg.get("use_dora") or cfg.get("bias", "none") != "none":
        raise MergeUnsupported("DoRA adapters and LoRA biases are not merged")
    r, alpha = cfg["r"], cfg["lora_alpha"]
    parts: dict[tuple[int, str], dict[str, object]] = {}
    for name, tensor in load_file(adapter_dir / "adapter_model.safetensors", device="cpu").items():
        m = _KEY.search(name)
        if m is None:
            raise MergeUnsupported(f"adapter weight {name} is not on a decoder projection")
        parts.setdefault((int(m.group(1)), m.group(3)), {})[m.group(4)] = tensor
    return LoRAFactors({key: (ab["B"].float(), ab["A"].float()) for key, ab in parts.items()},
                       alpha / (r ** 0.5 if cfg.get("use_rslora") else r))


def _write_merged(target, w, b, a, scale: float) -> None:
    """target = w + scale * b @ a, in float32 and rounded once to w's dtype, a few rows at a time."""
    import torch

    b, a = b.to(w.device), a.to(w.device)
    step = max(1, CHUNK_BYTES // (w.shape[1] * 4))
    for r in range(0, w.shape[0], step):
        rows = slice(r, r + step)
        target[rows].copy_(torch.addmm(w[rows].float(), b[rows], a, alpha=scale).to(w.dtype))


def _hf_weight(base_layer, group: str, proj: str):
    return getattr(getattr(base_layer, group), proj).weight


def load_weights(llm, base_model, factors: LoRAFactors | None) -> int:
    """Write base + scale * B A (or the base alone, factors None) into every fused projection of the engine's
    model; returns how many tensors were written."""
    import torch

    hf_layers = base_model.model.layers

    def targets(model):
        layers = getattr(getattr(model, "model", None), "layers", None)
        if layers is None or len(layers) != len(hf_layers):
            raise MergeUnsupported("the engine's model has no decoder layers like the training base's")
        for i, layer in enumerate(layers):
            for (group, fused), projs in FUSED.items():
                module = getattr(getattr(layer, group, None), fused, None)
                if module is None:
                    raise MergeUnsupported(f"the engine's layer {i} has no {group}.{fused}")
                yield i, group, fused, projs, getattr(module, "base_layer", module).weight

    def write(model) -> int:
        # Every shape is checked before the first write: a refused merge leaves the engine as it was.
        for i, group, fused, projs, target in targets(model):
            rows = sum(_hf_weight(hf_layers[i], group, p).shape[0] for p in projs)
            cols = _hf_weight(hf_layers[i], group, projs[0]).shape[1]
            if tuple(target.shape) != (rows, cols) or target.dtype != _hf_weight(hf_layers[i], group, projs[0]).dtype:
                raise MergeUnsupported(f"layer {i} {fused}: engine weight {tuple(target.shape)} {target.dtype}, "
                                       f"training base ({rows}, {cols}) (tensor parallel, packed or another dtype?)")
        written = 0
        with torch.no_grad():
            for i, group, fused, projs, target in targets(model):
                row = 0
                for proj in projs:
                    w = _hf_weight(hf_layers[i], group, proj)
                    pair = None if factors is None else factors.pairs.get((i, proj))
                    if pair is None:
                        target[row:row + w.shape[0]].copy_(w)
                    else:
                        _write_merged(target[row:row + w.shape[0]], w, *pair, factors.scale)
                    row += w.shape[0]
                written += 1
        return written

    counts = llm.apply_model(write)
    llm.reset_prefix_cache()
    return sum(counts)
