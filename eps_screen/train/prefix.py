"""Shared prefixes in packed training batches: a micro-batch's examples that begin with the same tokens compute
those tokens once.

Under A1 every example carries a ~1,040-token system prompt, and a batch of 8 drawn from a cell's 600 examples
holds ~2.7 of the source persona's (the same prompt) and often two of another persona's. `share_prefixes` rewrites
a padding-free batch (TRL's collator output: one packed row, cu_seq_lens_q) so each group of examples with a
common prefix becomes that prefix once, followed by each example's remaining tokens (its suffix), and tells the
attention (eps_screen.train.attention) which keys each segment sees: a suffix attends to its group's prefix and,
causally, to itself; positions are the original ones.

Why it is the same function: every suffix token sees exactly the keys and positions it saw unshared, so its hidden
states, logits and loss are the same; the prefix's hidden states are the same, and their gradient is the sum of what
each example's copy received (autograd sums it through the key/value gather). The labels are kept token for token,
so TRL's loss normalisation (labelled tokens per optimizer step) does not change. A prefix stops before the token
in front of its first label: then every labelled token's predecessor sits in its own suffix, and the token that
follows a segment in the packed row is never a target (TRL shifts labels across the row).
"""

from __future__ import annotations

from dataclasses import dataclass, field

IGNORE = -100  # the label of a token that is no target (transformers' ignore index)
# Below this many shared tokens a group saves less than its bookkeeping costs (the A0 system prompt is 6-20 tokens).
MIN_SHARED = 32
KV_INDEX = "eps_kv_index"  # the batch key the attention reads: per segment, the packed-row positions of its keys


@dataclass
class _Group:
    members: list[int]
    shared: int  # prefix length every member may share (alone: the most its one member may)
    first: list[int] = field(repr=False)  # the first member's tokens (the prefix is read from them)


def _common(a: list[int], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _limit(labels: list[int]) -> int:
    """The longest prefix a sequence may share: everything before the token in front of its first target (and at
    least one token of suffix)."""
    first = next((i for i, lbl in enumerate(labels) if lbl != IGNORE), len(labels))
    return max(0, min(first - 1, len(labels) - 1))


def group_prefixes(seqs: list[list[int]], labels: list[list[int]], min_shared: int = MIN_SHARED) -> list[_Group]:
    """Groups of sequences with a common prefix of at least `min_shared` tokens (sorted order puts them side by
    side); a sequence with none is a group of one."""
    order = sorted(range(len(seqs)), key=lambda i: seqs[i])
    groups: list[_Group] = []
    for i in order:
        limit = _limit(labels[i])
        if groups:
            g = groups[-1]
            shared = min(g.shared, _common(g.first, seqs[i], limit))
            if shared >= min_shared:
                g.members.append(i)
                g.shared = shared
                continue
        groups.append(_Group([i], limit, seqs[i]))
    return groups


def share_prefixes(batch: dict, min_shared: int = MIN_SHARED) -> dict:
    """The padding-free batch with shared prefixes (see the module doc), or the batch itself when no two of its
    sequences share `min_shared` tokens."""
    import torch

    ids = batch["input_ids"][0].tolist()
    lbl = batch["labels"][0].tolist()
    pos = batch["position_ids"][0].tolist()
    cu = batch["cu_seq_lens_q"].tolist()
    seqs = [ids[a:b] for a, b in zip(cu[:-1], cu[1:], strict=True)]
    labels = [lbl[a:b] for a, b in zip(cu[:-1], cu[1:], strict=True)]
    positions = [pos[a:b] for a, b in zip(cu[:-1], cu[1:], strict=True)]
    groups = group_prefixes(seqs, labels, min_shared)
    if all(len(g.members) == 1 for g in groups):
        return batch
    new_ids, new_lbl, new_pos, kv, cu_q, cu_k = [], [], [], [], [0], [0]

    def segment(tokens, targets, where, keys):
        start = len(new_ids)
        new_ids.extend(tokens)
        new_lbl.extend(targets)
        new_pos.extend(where)
        kv.extend(keys(start, len(new_ids)))
        cu_q.append(len(new_ids))
        cu_k.append(len(kv))

    for g in groups:
        p = g.shared
        if len(g.members) == 1:
            i = g.members[0]
            segment(seqs[i], labels[i], positions[i], lambda a, b: range(a, b))
            continue
        head = g.members[0]
        prefix_at = len(new_ids)
        segment(seqs[head][:p], labels[head][:p], positions[head][:p], lambda a, b: range(a, b))
        prefix = range(prefix_at, prefix_at + p)
        for i in g.members:
            segment(seqs[i][p:], labels[i][p:], positions[i][p:], lambda a, b: [*prefix, *range(a, b)])
    q_lens = [b - a for a, b in zip(cu_q[:-1], cu_q[1:], strict=True)]
    k_lens = [b - a for a, b in zip(cu_k[:-1], cu_k[1:], strict=True)]
    out = {k: v for k, v in batch.items() if k not in ("seq_idx",)}
    out.update(
        input_ids=torch.tensor([new_ids], dtype=batch["input_ids"].dtype),
        labels=torch.tensor([new_lbl], dtype=batch["labels"].dtype),
        position_ids=torch.tensor([new_pos], dtype=batch["position_ids"].dtype),
        cu_seq_lens_q=torch.tensor(cu_q, dtype=torch.int32),
        cu_seq_lens_k=torch.tensor(cu_k, dtype=torch.int32),
        max_length_q=max(q_lens),
        max_length_k=max(k_lens),
    )
    out[KV_INDEX] = torch.tensor(kv, dtype=torch.long)
    return out


class PrefixSharingCollator:
    """Wraps a padding-free collator (TRL's): its batches with shared prefixes. Counts the tokens it saved."""

    def __init__(self, inner, min_shared: int = MIN_SHARED):
        self.inner = inner
        self.min_shared = min_shared
        self.tokens_in = 0
        self.tokens_out = 0

    def __call__(self, examples):
        batch = self.inner(examples)
        if "cu_seq_lens_q" not in batch:  # not a packed batch: nothing to share
            return batch
        shared = share_prefixes(batch, self.min_shared)
        self.tokens_in += batch["input_ids"].shape[1]
        self.tokens_out += shared["input_ids"].shape[1]
        return shared
