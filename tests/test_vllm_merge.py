"""Merging one adapter into an engine's fused weights (eps_screen.generation.vllm_merge), checked on the tiny model
against PEFT's own merge. The engine is a stand-in module with vLLM's fused layout (qkv_proj, gate_up_proj); the
real engine path is measured on the H200 (benchmarks/gpu_lora_eval_bench.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from benchmarks.gpu_common import random_adapter  # noqa: E402
from eps_screen.generation.vllm_merge import MergeUnsupported, load_weights, lora_factors  # noqa: E402


class _FusedEngine:
    """vLLM's module layout for a Qwen2 decoder, holding copies of the base's weights; apply_model as vLLM's."""

    def __init__(self, hf, rows_off: int = 0):
        layers = torch.nn.ModuleList()
        for layer in hf.model.layers:
            a, m = layer.self_attn, layer.mlp
            block = torch.nn.Module()
            block.self_attn, block.mlp = torch.nn.Module(), torch.nn.Module()
            for holder, name, parts in ((block.self_attn, "qkv_proj", (a.q_proj, a.k_proj, a.v_proj)),
                                        (block.self_attn, "o_proj", (a.o_proj,)),
                                        (block.mlp, "gate_up_proj", (m.gate_proj, m.up_proj)),
                                        (block.mlp, "down_proj", (m.down_proj,))):
                w = torch.cat([p.weight.detach().clone() for p in parts])
                lin = torch.nn.Linear(w.shape[1], w.shape[0] + rows_off, bias=False)
                lin.weight.data[: w.shape[0]] = w
                setattr(holder, name, lin)
            layers.append(block)
        self.model = torch.nn.Module()
        self.model.model = torch.nn.Module()
        self.model.model.layers = layers
        self.prefix_resets = 0

    def apply_model(self, fn):
        return [fn(self.model)]

    def reset_prefix_cache(self):
        self.prefix_resets += 1

    def weights(self):
        return {k: v.clone() for k, v in self.model.state_dict().items()}


def _adapter(base, out_dir):
    """A random adapter, and the weights PEFT's own merge makes of it (the base is left as it was)."""
    from peft import PeftModel

    random_adapter(base, out_dir)
    model = PeftModel.from_pretrained(base.model, out_dir)
    try:
        merged = {n: p.detach().clone() for n, p in model.merge_and_unload(progressbar=False, safe_merge=True).named_parameters()}
    finally:
        if base.model.__dict__.get("peft_config") is not None:
            del base.model.peft_config
    return out_dir, merged


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from eps_screen.models.loading import load_base

    base = load_base("tiny", "float32")
    before = {n: p.detach().clone() for n, p in base.model.named_parameters()}
    adapter, peft_merged = _adapter(base, tmp_path_factory.mktemp("adapter") / "a")
    # merge_and_unload wrote the update into the shared base: put the base's own weights back.
    with torch.no_grad():
        for n, p in base.model.named_parameters():
            p.copy_(before[n])
    return base, adapter, peft_merged, before


@pytest.mark.parametrize("chunk_bytes", [None, 1, 3000], ids=["default", "one-row", "ragged"])
def test_merged_weights_equal_peft_merge_and_restore_is_exact(tiny, chunk_bytes, monkeypatch):
    """Also when each update is written a row, or an uneven number of rows, at a time (the 7B merge on a full card)."""
    from eps_screen.generation import vllm_merge

    if chunk_bytes is not None:
        monkeypatch.setattr(vllm_merge, "CHUNK_BYTES", chunk_bytes)
    base, adapter, peft_merged, before = tiny
    engine = _FusedEngine(base.model)
    original = engine.weights()
    written = load_weights(engine, base.model, lora_factors(adapter))
    n_layers = len(base.model.model.layers)
    assert written == 4 * n_layers and engine.prefix_resets == 1
    w = engine.model.model.layers[0].self_attn.qkv_proj.weight
    want = torch.cat([peft_merged[f"model.layers.0.self_attn.{p}.weight"] for p in ("q_proj", "k_proj", "v_proj")])
    assert torch.allclose(w, want, atol=1e-6)
    down = engine.model.model.layers[-1].mlp.down_proj.weight
    assert torch.allclose(down, peft_merged[f"model.layers.{n_layers - 1}.mlp.down_proj.weight"], atol=1e-6)
    assert not torch.equal(w, original["model.layers.0.self_attn.qkv_proj.weight"]), "the adapter must change weights"
    load_weights(engine, base.model, None)
    assert all(torch.equal(v, original[k]) for k, v in engine.weights().items()), "restore must be exact"
    assert all(torch.equal(p, before[n]) for n, p in base.model.named_parameters()), "the training base is untouched"


def test_a_layout_it_cannot_merge_changes_nothing(tiny):
    base, adapter, _, _ = tiny
    engine = _FusedEngine(base.model, rows_off=4)  # as if the fused weights were sharded or padded
    original = engine.weights()
    with pytest.raises(MergeUnsupported, match="qkv_proj"):
        load_weights(engine, base.model, lora_factors(adapter))
    assert all(torch.equal(v, original[k]) for k, v in engine.weights().items())
