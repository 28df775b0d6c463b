"""GPU tier: training on CUDA with the real speed levers (bf16, varlen padding-free batches, Liger), on the tiny
model. Run on the H200 test machine: `python -m pytest tests/gpu -m gpu` (deselected by default)."""

from __future__ import annotations

import hashlib

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _config(**training):
    from eps_screen.spec.config import ScreenConfig

    base = ScreenConfig()
    # Liger off unless a test asks for it: its kernels stay on the shared base for good, and a compiled run after
    # them is skipped (test_liger_training_runs checks that), so the other tests must not switch it on by default.
    training.setdefault("liger", False)
    extra = {k: training.pop(k) for k in ("liger", "max_batch_tokens", "compile", "fused_lora") if k in training}
    t = base.training.model_copy(update={"epochs": 2, "batch_size": 4, "learning_rate": 1e-3, **training, **extra})
    return base.model_copy(update={
        "training": t,
        "model": base.model.model_copy(update={"base": "tiny", "dtype": "bfloat16"}),
        "lora": base.lora.model_copy(update={"rank": 8, "alpha": 16}),
    })


def _examples(n=16):
    from eps_screen.train.data import Example

    return [
        Example(
            "You are a librarian who helps people find information." + " Be brief." * (i % 5),
            "How do I find a good book? Answer in one sentence.",
            "Ask at the desk and browse the shelves you like." + " Then read a page." * (i % 7),
            i % 3 == 0,
        )
        for i in range(n)
    ]


def _digest(model) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def base():
    from eps_screen.models.loading import load_base

    b = load_base("tiny", "bfloat16")
    assert next(b.model.parameters()).is_cuda
    return b


def test_cells_in_a_row_leave_base_and_memory_unchanged(base, tmp_path):
    from safetensors.torch import load_file

    from eps_screen.train.lora import train_lora

    before = _digest(base.model)
    allocated = []
    for i, packing in enumerate([False, True, True]):
        rep = train_lora(base, _examples(), _config(packing=packing), whole_answer=i != 1, seed=i, out_dir=tmp_path / f"c{i}")
        allocated.append(torch.cuda.memory_allocated())
        assert rep.options["bf16"] and rep.steps > 0 and rep.final_loss is not None
        weights = load_file(tmp_path / f"c{i}" / "adapter_model.safetensors")
        lora_b = [w for k, w in weights.items() if "lora_B" in k]
        assert lora_b and any(w.abs().sum() > 0 for w in lora_b), "LoRA B starts at zero: training must move it"
    assert _digest(base.model) == before, "the base weights changed"
    assert "forward" not in base.model.__dict__ and not hasattr(base.model, "peft_config")
    assert base.model.config._attn_implementation == "sdpa"
    assert max(allocated) - min(allocated) < 32 * 2**20, f"memory grew across cells: {allocated}"


def test_padding_free_varlen_matches_padded(base):
    """Same model, same batch: the packed varlen forward gives the padded forward's logits."""
    from eps_screen.train.attention import use_varlen_attention

    m = base.model
    torch.manual_seed(0)
    lens = [37, 120, 5, 64]
    seqs = [torch.randint(10, 1500, (n,), device="cuda") for n in lens]
    width = max(lens)
    ids = torch.zeros(len(lens), width, dtype=torch.long, device="cuda")
    att = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        att[i, : len(s)] = 1
    with torch.no_grad():
        ref = m(input_ids=ids, attention_mask=att).logits.float()
    prev = use_varlen_attention(m)
    try:
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        pos = torch.cat([torch.arange(n, device="cuda") for n in lens])[None]
        with torch.no_grad():
            out = m(input_ids=torch.cat(seqs)[None], position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                    max_length_q=width, max_length_k=width).logits.float()
    finally:
        m.set_attn_implementation(prev)
    for i, n in enumerate(lens):
        got, want = out[0, cu[i] : cu[i + 1]], ref[i, :n]
        assert float((got - want).norm() / want.norm()) < 2e-2


def test_compiled_blocks_train_and_are_released(base, tmp_path):
    """training.compile: each decoder block compiled for the run, plain again afterwards; Liger stays off."""
    from eps_screen.train.lora import train_lora

    before = _digest(base.model)
    rep = train_lora(base, _examples(), _config(packing=True, compile=True), whole_answer=True, seed=0, out_dir=tmp_path)
    assert rep.options["compile"] and not rep.options["liger"] and rep.options["fused_lora"]
    assert rep.final_loss == rep.final_loss
    assert all(getattr(layer, "_compiled_call_impl", None) is None for layer in base.model.model.layers)
    assert _digest(base.model) == before


def test_liger_training_runs(base, tmp_path):
    pytest.importorskip("liger_kernel")
    from eps_screen.train.lora import train_lora

    rep = train_lora(base, _examples(), _config(packing=True, liger=True), whole_answer=True, seed=0, out_dir=tmp_path)
    assert rep.options["liger"] and rep.final_loss is not None and rep.final_loss == rep.final_loss
    # Liger stays on the base for good: a later compile request in this process runs uncompiled instead of failing.
    again = train_lora(base, _examples(), _config(packing=True, compile=True), whole_answer=True, seed=0,
                       out_dir=tmp_path / "again")
    assert not again.options["compile"] and "compile_skipped" in again.options


def test_gradient_checkpointing_and_micro_batches(base, tmp_path):
    from eps_screen.train.lora import train_lora

    rep = train_lora(base, _examples(), _config(gradient_checkpointing=True, max_batch_tokens=64), whole_answer=True,
                     seed=0, out_dir=tmp_path)
    assert rep.micro_batch * rep.grad_accum == 4 and rep.micro_batch < 4
    assert not base.model.is_gradient_checkpointing


def test_fused_lora_matches_peft_in_bf16(base):
    from peft import LoraConfig, get_peft_model

    from eps_screen.train.lora import _fuse_lora

    torch.manual_seed(0)
    model = get_peft_model(base.model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    try:
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.05)
        ids = torch.randint(10, 1500, (2, 40), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ref = model(input_ids=ids).logits.float()
            _fuse_lora(model)
            out = model(input_ids=ids).logits.float()
        assert float((out - ref).norm() / ref.norm()) < 2e-2
    finally:
        model.unload()
        if base.model.__dict__.get("peft_config") is not None:
            del base.model.peft_config
