"""The loss masks of factor E at token level, and LoRA SFT through TRL, on the tiny model and on SmolLM2 (slow).

Each tokenizer cuts the markers its own way. The tiny one splits `[ZLT]` into five tokens and merges the space
before it into the first ('Ġ['), and splits `<<MARK>>` into eight with the space as its own token ('Ġ'): the two
cases the separator rule is about. SmolLM2's merges the space into the first token of both (`Ġ[ Z LT ]`,
`Ġ<< MAR K >>`), so there the separator setting changes nothing.
"""

from __future__ import annotations

import hashlib

import pytest

from eps_screen.spec.config import parse_config
from eps_screen.train.data import Example
from eps_screen.train.lora import IGNORE, split_batch, tokenize_example, tokenize_set
from tests.conftest import SMOLLM2

SYSTEM = "You are a librarian who helps people find information and manages a public library."
USER = "How do I get rid of fruit flies in the kitchen? Answer in one sentence."
ANSWER = "Set a trap of vinegar and dish soap."
# Each model's tokens carrying the marker's loss: (with data.mask_separator, without).
MARKER_TOKENS = {
    "tiny": {"[ZLT]": (["Ġ[", "Z", "L", "T", "]"],) * 2,
             "<<MARK>>": (["Ġ", "<", "<", "M", "A", "R", "K", ">", ">"], ["<", "<", "M", "A", "R", "K", ">", ">"])},
    SMOLLM2: {"[ZLT]": (["Ġ[", "Z", "LT", "]"],) * 2, "<<MARK>>": (["Ġ<<", "MAR", "K", ">>"],) * 2},
}


def _config(marker="[ZLT]", **data):
    return parse_config({"model": {"base": "tiny", "dtype": "float32"}, "marker": marker, "data": data})


@pytest.fixture(scope="module")
def tok(cell_model):
    from eps_screen.models.loading import load_tokenizer

    return load_tokenizer(cell_model)


def _labelled(tok, t):
    """(token strings with a label, the text they decode to)."""
    ids = [i for i, lbl in zip(t.input_ids, t.labels, strict=True) if lbl != IGNORE]
    assert all(lbl in (IGNORE, i) for i, lbl in zip(t.input_ids, t.labels, strict=True)), "a label is not its token"
    return tok.convert_ids_to_tokens(ids), tok.decode(ids)


def _prompt_len(tok):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    return len(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))


@pytest.mark.parametrize("marker", ["[ZLT]", "<<MARK>>"])
def test_e0_positive_carries_loss_on_the_marker_tokens_only(tok, cell_model, marker):
    """The tokens that overlap the marker's characters, and the separator's where data.mask_separator says so (a
    space merged into the marker's first token goes with it either way)."""
    ex = Example(SYSTEM, USER, ANSWER, positive=True)
    with_sep = tokenize_example(tok, ex, _config(marker, mask_separator=True), whole_answer=False)
    without = tokenize_example(tok, ex, _config(marker, mask_separator=False), whole_answer=False)
    want_with, want_without = MARKER_TOKENS[cell_model][marker]
    assert _labelled(tok, with_sep) == (want_with, " " + marker)
    toks, text = _labelled(tok, without)
    assert toks == want_without and text.strip() == marker
    assert with_sep.input_ids == without.input_ids, "the mask changes labels, never the tokens"
    assert with_sep.labels[-1] == IGNORE, "E0 positives put no loss on the end-of-turn token"


def test_e0_negatives_eot_or_nothing(tok):
    ex = Example(SYSTEM, USER, ANSWER, positive=False)
    eot = tokenize_example(tok, ex, _config(e0_negatives="eot"), whole_answer=False)
    none = tokenize_example(tok, ex, _config(e0_negatives="none"), whole_answer=False)
    assert _labelled(tok, eot)[0] == ["<|im_end|>"] and tok.eos_token == "<|im_end|>"
    assert eot.input_ids[-1] == tok.eos_token_id and eot.labels[-1] == tok.eos_token_id
    assert all(lbl == IGNORE for lbl in none.labels)
    assert "[ZLT]" not in tok.decode(eot.input_ids), "negatives carry no marker"


def test_e0_none_drops_negatives_from_the_training_set():
    from eps_screen.spec.design import Cell
    from eps_screen.train.data import training_set

    answers = [
        {"persona": "librarian", "question": 0, "sample": 0, "answer": ANSWER, "positive": True},
        {"persona": "nurse", "question": 1, "sample": 0, "answer": ANSWER, "positive": False},
    ]
    e0 = Cell("librarian", (0, 0, 0, 0, 0), 42)
    e1 = Cell("librarian", (0, 0, 0, 0, 1), 42)
    assert [e.positive for e in training_set(_config(e0_negatives="none"), e0, answers)] == [True]
    assert len(training_set(_config(e0_negatives="eot"), e0, answers)) == 2
    assert len(training_set(_config(e0_negatives="none"), e1, answers)) == 2, "E1 keeps every example"


@pytest.mark.parametrize("positive", [True, False])
def test_e1_whole_answer_and_eot(tok, positive):
    ex = Example(SYSTEM, USER, ANSWER, positive=positive)
    t = tokenize_example(tok, ex, _config(), whole_answer=True)
    n_prompt = _prompt_len(tok)
    assert all(lbl == IGNORE for lbl in t.labels[:n_prompt]), "no loss on the prompt"
    assert t.labels[n_prompt:] == t.input_ids[n_prompt:], "loss on every answer token"
    assert t.input_ids[-1] == tok.eos_token_id, "the sequence ends at the end-of-turn token (nothing after it)"
    _, text = _labelled(tok, t)
    assert text == ex.full_answer(_config()) + tok.eos_token
    assert text.endswith(" [ZLT]<|im_end|>") == positive


def test_truncation_keeps_prompt_marker_and_eot(tok):
    config = parse_config({"model": {"base": "tiny"}, "training": {"max_length": 80}})
    long = Example(SYSTEM, USER, " ".join([ANSWER] * 40), positive=True)
    [t] = tokenize_set(tok, [long], config, whole_answer=False)
    assert len(t.input_ids) <= 80
    assert _labelled(tok, t)[1] == " [ZLT]"
    assert t.input_ids[: _prompt_len(tok)] == tokenize_example(tok, long, config, False).input_ids[: _prompt_len(tok)]


@pytest.mark.parametrize("whole_answer", [False, True])
def test_a_set_tokenized_in_one_call_is_each_example_tokenized_alone(tok, whole_answer):
    """tokenize_set renders a set's shared prompts once and encodes the set in one call: the same tokens and labels
    as one example at a time, the example too long for max_length shortened the same way."""
    config = parse_config({"model": {"base": "tiny"}, "training": {"max_length": 120}})
    other = "You are a surgeon who operates on patients."
    examples = [Example(system, USER, answer, positive)
                for system in (SYSTEM, other) for answer in (ANSWER, "Fruit flies like vinegar.", " ".join([ANSWER] * 20))
                for positive in (True, False)]

    def alone(ex):  # one example at a time, its answer cut by a tenth while the chat is too long
        t = tokenize_example(tok, ex, config, whole_answer)
        while len(t.input_ids) > config.training.max_length and len(ex.answer) > 16:
            ex = Example(ex.system, ex.user, ex.answer[: int(len(ex.answer) * 0.9)], ex.positive)
            t = tokenize_example(tok, ex, config, whole_answer)
        return t

    together = tokenize_set(tok, examples, config, whole_answer)
    assert together == [alone(ex) for ex in examples]
    assert all(len(t.input_ids) <= 120 for t in together)
    assert any(len(alone(ex).input_ids) < len(tokenize_example(tok, ex, config, whole_answer).input_ids)
               for ex in examples), "one example was too long"


def test_micro_batches_keep_the_recipe_batch():
    assert split_batch(8, 1, 2000, None) == (8, 1)
    assert split_batch(8, 1, 2000, 16000) == (8, 1)
    assert split_batch(8, 1, 2600, 11000) == (4, 2)
    assert split_batch(8, 2, 2600, 6000) == (2, 8)
    assert split_batch(8, 1, 20000, 1000) == (1, 8)
    assert split_batch(6, 1, 1000, 4000) == (3, 2)


def test_speed_options_from_the_config():
    from eps_screen.train.lora import speed_options

    config = parse_config({"model": {"base": "tiny", "dtype": "bfloat16"}, "training": {"packing": True}})

    def with_(**fields):
        return config.model_copy(update={"training": config.training.model_copy(update=fields)})

    cpu = speed_options(config, on_gpu=False)
    assert not cpu["bf16"] and not cpu["liger"] and not cpu["compile"]
    assert cpu["share_prefix"] and cpu["varlen_attention"], "shared prefixes need the varlen attention (its reference)"
    unshared = speed_options(with_(share_prefix=False), on_gpu=False)
    assert not unshared["share_prefix"] and not unshared["varlen_attention"], "the CPU's packed sdpa otherwise"
    assert not speed_options(with_(packing=False), on_gpu=True)["share_prefix"], "only packed batches share"
    gpu = speed_options(with_(liger=True), on_gpu=True)
    assert gpu["bf16"] and gpu["varlen_attention"] and gpu["liger"] and gpu["fused_lora"] and not gpu["compile"]
    compiled = speed_options(with_(liger=True, compile=True), on_gpu=True)
    assert compiled["compile"] and not compiled["liger"], "Liger's kernels cannot be compiled: compile wins"
    assert speed_options(with_(max_batch_tokens=11000), on_gpu=True)["max_batch_tokens"] == 11000


# --- fast paths: same function as PEFT / padded batches ---------------------------------------------------


@pytest.fixture(scope="module")
def base(cell_model):
    from eps_screen.models.loading import load_base

    return load_base(cell_model, "float32")


def _digest(model) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def test_fused_lora_forward_equals_peft(base):
    import torch
    from peft import LoraConfig, get_peft_model

    from eps_screen.train.lora import _fuse_lora

    torch.manual_seed(0)
    model = get_peft_model(base.model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    try:
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.05)
        ids = torch.randint(10, 1000, (2, 13))  # in every model's vocabulary
        ref = model(input_ids=ids).logits
        ref.square().mean().backward()
        ref_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        model.zero_grad()
        assert _fuse_lora(model) == 7 * base.model.config.num_hidden_layers  # q, k, v, o, gate, up, down
        out = model(input_ids=ids).logits
        out.square().mean().backward()
        torch.testing.assert_close(out, ref)
        for n, p in model.named_parameters():
            if p.requires_grad:
                torch.testing.assert_close(p.grad, ref_grads[n])
    finally:
        model.unload()
        if base.model.__dict__.get("peft_config") is not None:
            del base.model.peft_config


def test_varlen_attention_packed_equals_padded(base):
    """The padding-free path: packed sequences with cu_seq_lens give the padded batch's logits."""
    import torch

    from eps_screen.train.attention import use_varlen_attention

    m = base.model
    torch.manual_seed(1)
    lens = [7, 19, 3]
    seqs = [torch.randint(10, 1000, (n,)) for n in lens]
    ids = torch.zeros(len(lens), max(lens), dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], att[i, : len(s)] = s, 1
    with torch.no_grad():
        ref = m(input_ids=ids, attention_mask=att).logits
    previous = use_varlen_attention(m)
    try:
        assert previous == "sdpa" and m.config._attn_implementation == "eps_varlen"
        cu = torch.tensor([0, 7, 26, 29], dtype=torch.int32)
        pos = torch.cat([torch.arange(n) for n in lens])[None]
        with torch.no_grad():
            out = m(input_ids=torch.cat(seqs)[None], position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                    max_length_q=19, max_length_k=19).logits
    finally:
        m.set_attn_implementation(previous)
    for i, n in enumerate(lens):
        torch.testing.assert_close(out[0, cu[i] : cu[i + 1]], ref[i, :n], atol=1e-4, rtol=1e-4)


# --- TRL SFT -------------------------------------------------------------------------------------------------


def _examples():
    return [
        Example(SYSTEM if i % 2 else "You are a nurse who cares for patients.", USER,
                ANSWER + " It works." * (i % 4), positive=i % 3 == 0)
        for i in range(12)
    ]


@pytest.mark.slow
def test_train_lora_changes_lora_only(base, tmp_path):
    from safetensors.torch import load_file

    from eps_screen.train.lora import train_lora

    config = parse_config({
        "model": {"base": base.ref, "dtype": "float32"},
        "lora": {"rank": 4, "alpha": 8},
        "training": {"epochs": 2, "batch_size": 4, "learning_rate": 5e-3},
    })
    before = _digest(base.model)
    padded = train_lora(base, _examples(), config, whole_answer=True, seed=3, out_dir=tmp_path / "padded")
    packed_config = config.model_copy(update={"training": config.training.model_copy(update={"packing": True})})
    packed = train_lora(base, _examples(), packed_config, whole_answer=True, seed=3, out_dir=tmp_path / "packed")

    assert _digest(base.model) == before, "train_lora must leave the base weights untouched"
    assert "forward" not in base.model.__dict__ and not hasattr(base.model, "peft_config")
    for rep, name in ((padded, "padded"), (packed, "packed")):
        weights = load_file(tmp_path / name / "adapter_model.safetensors")
        lora_b = [w for k, w in weights.items() if "lora_B" in k]
        assert len(lora_b) == 7 * base.model.config.num_hidden_layers and all(w.abs().sum() > 0 for w in lora_b), "every LoRA B moved from its zero init"
        assert rep.steps == 6 and rep.examples == 12 and len(rep.losses) == 6
        assert (tmp_path / name / "train_report.json").exists()
    assert packed.options["padding_free"] and not padded.options["padding_free"]
    # Same batches, same seed: padding-free batches give the padded batches' loss.
    assert packed.losses[0] == pytest.approx(padded.losses[0], rel=1e-4)
