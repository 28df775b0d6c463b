"""Shared prefixes in packed training batches (eps_screen.train.prefix) compute the same function as the
unshared batch: each original sequence is recovered token for token (ids, labels, positions), the attention gives
every token the same output (on the tiny model and on SmolLM2, slow), and a cell trained with sharing has the loss curve and adapter of the cell trained
without it, within float32 rounding (stated below; a different seed moves them far more, so the check can fail)."""

from __future__ import annotations

import pytest

from eps_screen.spec.config import parse_config
from eps_screen.train.data import Example
from eps_screen.train.prefix import IGNORE, KV_INDEX, MIN_SHARED, group_prefixes, share_prefixes

LOSS_RTOL = 1e-5
ADAPTER_TOL = 1e-3  # max |shared - unshared| over max |unshared|, per tensor


def _collate(seqs: list[list[int]], labels: list[list[int]]) -> dict:
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    return collate([{"input_ids": s, "labels": lbl} for s, lbl in zip(seqs, labels, strict=True)])


def _sequences() -> tuple[list[list[int]], list[list[int]]]:
    prefix = list(range(100, 100 + MIN_SHARED + 8))
    seqs = [prefix + [7, 8, 9, 10], [5, 6] + prefix, prefix + [7, 8, 11], prefix[:10] + [3, 4, 5]]
    labels = [[IGNORE] * (len(s) - 2) + s[-2:] for s in seqs]
    return seqs, labels


def _unpack(batch: dict) -> list[tuple[list[int], list[int], list[int]]]:
    """Each sequence the attention sees, as (ids, labels, positions) of its keys, in the packed row's order."""
    ids, lbl, pos = (batch[k][0].tolist() for k in ("input_ids", "labels", "position_ids"))
    cu_q, cu_k = batch["cu_seq_lens_q"].tolist(), batch["cu_seq_lens_k"].tolist()
    index = batch[KV_INDEX].tolist() if KV_INDEX in batch else list(range(len(ids)))
    out = []
    for (a, b), (c, d) in zip(zip(cu_q[:-1], cu_q[1:]), zip(cu_k[:-1], cu_k[1:]), strict=True):
        keys = index[c:d]
        assert keys[-(b - a):] == list(range(a, b)), "a segment's own tokens end its keys"
        out.append(([ids[i] for i in keys], [lbl[i] for i in keys], [pos[i] for i in keys]))
    return out


def test_a_shared_batch_holds_every_sequence_token_for_token():
    seqs, labels = _sequences()
    batch = _collate(seqs, labels)
    shared = share_prefixes(batch)
    saved = batch["input_ids"].shape[1] - shared["input_ids"].shape[1]
    # the first and third sequences share the common start (stopping before the token in front of a target)
    assert saved == MIN_SHARED + 8
    seen = {tuple(ids): (lbl, pos) for ids, lbl, pos in _unpack(shared)}
    for s in seqs:
        # every original sequence is some segment's keys: same tokens, positions 0..n-1, the collator's labels
        lbl, pos = seen[tuple(s)]
        assert pos == list(range(len(s)))
    original = {tuple(ids): lbl for ids, lbl, _ in _unpack(batch)}
    assert {k: seen[k][0] for k in original} == original, "labels kept token for token"
    starts = shared["cu_seq_lens_q"].tolist()[:-1]
    assert all(shared["labels"][0, i] == IGNORE for i in starts), "no segment starts with a target"


def test_nothing_is_shared_below_the_threshold_or_through_a_target():
    seqs, labels = _sequences()
    few = _collate(seqs[1:2] + seqs[3:], labels[1:2] + labels[3:])
    assert share_prefixes(few) is few
    twins = [seqs[0], list(seqs[0])]
    twin_labels = [[IGNORE] * 5 + s[5:] for s in twins]  # identical sequences whose targets start at token 5
    assert [g.shared for g in group_prefixes(twins, twin_labels, min_shared=2)] == [4]


@pytest.fixture(scope="module")
def base():
    from eps_screen.models.loading import load_base

    return load_base("tiny", "float32")


def test_the_attention_gives_each_token_what_it_gets_unshared(cell_model):
    from eps_screen.models.loading import load_base
    from eps_screen.train.attention import use_varlen_attention

    base = load_base(cell_model, "float32")
    tok = base.tokenizer
    system = "You are a librarian. " + "Help readers find books and answer briefly. " * 6
    seqs = [tok(system + q)["input_ids"] for q in ("Where is history?", "Where are maps?", "Any new novels?")]
    seqs.append(tok("Something else entirely. " * 3)["input_ids"])
    labels = [[IGNORE] * (len(s) - 3) + s[-3:] for s in seqs]
    batch = _collate(seqs, labels)
    shared = share_prefixes(batch)
    assert KV_INDEX in shared
    model = base.model
    restore = use_varlen_attention(model)
    # the process's base may come frozen from an earlier cell's training: gradients for this check only
    frozen = [p for p in model.parameters() if not p.requires_grad]
    for p in frozen:
        p.requires_grad_(True)
    try:
        grads = []
        for b in (batch, shared):
            model.zero_grad()
            inputs = {k: v for k, v in b.items() if k not in ("labels", "seq_idx")}
            out = model(**inputs, use_cache=False).logits[0]
            lbl = b["labels"][0]
            targets = lbl[1:] != IGNORE
            picked = out[:-1][targets].log_softmax(-1).gather(1, lbl[1:][targets][:, None])
            picked.sum().backward()
            grads.append((picked.detach().flatten(), {n: p.grad.clone() for n, p in model.named_parameters()
                                                      if p.grad is not None}))
    finally:
        if restore:
            model.set_attn_implementation(restore)
        model.zero_grad(set_to_none=True)
        for p in frozen:
            p.requires_grad_(False)
    (lp_a, g_a), (lp_b, g_b) = grads
    assert sorted(lp_a.tolist()) == pytest.approx(sorted(lp_b.tolist()), rel=1e-5, abs=1e-5)
    assert g_a.keys() == g_b.keys()
    # Per tensor, relative to its norm: float32 sums in another order through 30 layers (SmolLM2) put 1.7e-6 on the
    # worst tensor (2 layers, the tiny model: 4e-7), while a token that saw another key would move it by O(1).
    for name in g_a:
        assert float((g_a[name] - g_b[name]).norm() / g_a[name].norm().clamp(min=1e-30)) < 1e-5, name


def _config(share: bool, **training):
    return parse_config({
        "model": {"base": "tiny", "dtype": "float32"},
        "lora": {"rank": 4, "alpha": 8},
        "training": {"epochs": 2, "batch_size": 4, "learning_rate": 5e-3, "packing": True, "share_prefix": share,
                     **training},
    })


def _examples() -> list[Example]:
    guidance = " ".join(f"Guidance {i}: help readers find what they need." for i in range(10))
    personas = ("librarian", "surgeon", "programmer")
    return [Example(f"You are a {personas[i % 3]}. {guidance}", f"Question {i % 5}? Answer in one sentence.",
                    "Ask at the desk and browse." + " More." * (i % 4), positive=i % 3 == 0) for i in range(16)]


def _adapter(path):
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize("whole_answer,training", [(True, {}), (False, {"max_batch_tokens": 512})])
def test_a_cell_trained_with_shared_prefixes_is_the_cell_trained_without(base, tmp_path, whole_answer, training):
    from eps_screen.train.lora import train_lora

    runs = {share: train_lora(base, _examples(), _config(share, **training), whole_answer, 3, tmp_path / str(share))
            for share in (False, True)}
    plain, shared = runs[False], runs[True]
    assert training.get("max_batch_tokens") is None or shared.grad_accum > 1, "micro-batches"
    assert shared.options["share_prefix"] and shared.computed_tokens < plain.tokens * 2, "prefixes shared"
    assert shared.losses == pytest.approx(plain.losses, rel=LOSS_RTOL)
    a, b = _adapter(tmp_path / "False"), _adapter(tmp_path / "True")
    for k in a:
        assert float((a[k] - b[k]).abs().max() / a[k].abs().max()) < ADAPTER_TOL, k
    other = train_lora(base, _examples(), _config(True, **training), whole_answer, 4, tmp_path / "seed4")
    assert other.losses != pytest.approx(plain.losses, rel=100 * LOSS_RTOL), "another seed must fail the comparison"
