"""Several cells' LoRA adapters trained in the same forward and backward passes over one frozen base.

Multi-LoRA training systems (mLoRA/ASPEN, LoRAFusion) share the base model's matrix products among adapters; this
module does it for a GPU job's cells, which share the base. Each packed (padding-free) row holds micro-batches of
several cells side by side, and every LoRA layer adds to the one base GEMM over all tokens each token's own cell's
update (x A_c^T B_c^T * scale_c), through the cells' stacked adapters (_routed_forward). Each cell keeps what it
would have alone:
- its own batches, in its own order: the order TRL's trainer gives it (per epoch a permutation of the examples
  from torch.Generator seeded with seed + epoch, accelerate's SeedableRandomSampler, cut into micro-batches and
  optimizer steps as eps_screen.train.lora.split_batch cuts them);
- its own loss, normalised by the target tokens of its own optimizer step (transformers' num_items_in_batch);
  cells' losses are summed before one backward, and since their adapters share no parameter each adapter's
  gradient is exactly its own cell's;
- its own AdamW state, gradient clipping (max norm 1.0) and linear LR schedule with warm-up, as TRL's defaults;
- its own initialisation: the adapter is created under torch.manual_seed(seed), as train_lora creates it.
A cell that has run all its steps drops out of the micro-batches; cells may differ in rank, learning rate, epochs,
batch size and loss mask. What cannot be trained this way (padded batches, LoRA dropout, fractional epochs,
gradient checkpointing) has no `together_key` and is trained alone (eps_screen.train.stages decides).

The adapters are saved by PEFT exactly as train_lora saves them (one directory per cell, the format the evaluation
path loads). tests/test_training_together.py checks each cell's loss curve and adapter against train_lora's.
"""

from __future__ import annotations

import json
import math
import shutil
import time
import types
from dataclasses import asdict, dataclass
from pathlib import Path

from eps_screen.models.loading import release_cached_memory
from eps_screen.spec.config import ScreenConfig
from eps_screen.train.data import Example
from eps_screen.train.lora import (
    IGNORE,
    StepLog,
    Tokenized,
    TrainReport,
    _DevicePeak,
    split_batch,
    tokenize_set,
)

MAX_GRAD_NORM = 1.0  # transformers TrainingArguments' default, which train_lora keeps
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8
LM_HEAD_CHUNK = 4096  # target positions scored per LM-head chunk (the logits of a chunk are recomputed in backward)


@dataclass(frozen=True)
class Recipe:
    """Everything training one cell's adapter needs, read from that cell's own config (cells of one job may
    differ in what a factor sets)."""

    rows: tuple[Tokenized, ...]
    positives: int
    seed: int
    out_dir: Path
    rank: int
    alpha: float
    dropout: float
    target_modules: str
    learning_rate: float
    epochs: float
    batch_size: int
    grad_accum: int
    warmup_ratio: float
    max_batch_tokens: int | None
    packing: bool
    gradient_checkpointing: bool


def recipe(tokenizer, config: ScreenConfig, examples: list[Example], whole_answer: bool, seed: int,
           out_dir: Path) -> Recipe:
    rows = tokenize_set(tokenizer, examples, config, whole_answer)
    if not rows:
        raise ValueError("empty training set")
    t, lora = config.training, config.lora
    return Recipe(
        rows=tuple(rows), positives=sum(e.positive for e in examples), seed=seed, out_dir=Path(out_dir),
        rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout, target_modules=lora.target_modules,
        learning_rate=t.learning_rate, epochs=t.epochs, batch_size=t.batch_size, grad_accum=t.grad_accum,
        warmup_ratio=t.warmup_ratio, max_batch_tokens=t.max_batch_tokens, packing=t.packing,
        gradient_checkpointing=t.gradient_checkpointing,
    )


def shares_passes(packing: bool, dropout: float, gradient_checkpointing: bool, epochs: float) -> bool:
    """Whether a recipe of these settings can be trained in shared passes. Dropout would draw from one random stream
    for all cells (not the stream each has alone), padded batches and checkpointing are not implemented here, and a
    fractional epoch count is cut by TRL's max_steps logic, which this schedule does not repeat."""
    return packing and dropout == 0 and not gradient_checkpointing and epochs == int(epochs)


def together_key(r: Recipe) -> tuple | None:
    """Recipes with the same key can share passes; None: train it alone (shares_passes says why)."""
    if not shares_passes(r.packing, r.dropout, r.gradient_checkpointing, r.epochs):
        return None
    return (r.target_modules,)


def schedule(r: Recipe) -> list[list[list[int]]]:
    """The cell's optimizer steps, each a list of micro-batches of row indices, in the order TRL feeds them."""
    import torch

    n = len(r.rows)
    micro, accum = split_batch(r.batch_size, r.grad_accum, max(len(x.input_ids) for x in r.rows), r.max_batch_tokens)
    steps = []
    for epoch in range(int(r.epochs)):
        g = torch.Generator()
        g.manual_seed(r.seed + epoch)  # data_seed = seed; accelerate seeds each epoch with data_seed + epoch
        order = torch.randperm(n, generator=g).tolist()
        batches = [order[i:i + micro] for i in range(0, n, micro)]
        steps += [batches[i:i + accum] for i in range(0, len(batches), accum)]
    return steps


def _target_count(rows: list[Tokenized]) -> int:
    # Labels shift by one; the first token of every packed sequence is never a target (TRL's collator masks it).
    return sum(sum(lbl != IGNORE for lbl in r.labels[1:]) for r in rows)


class _Routing:
    """The token spans of the current packed row, one per cell (adapter name, first token, end), and for rows of
    several cells the 0/1 mask that keeps each token's own cell's block of the stacked LoRA ranks."""

    def __init__(self, ranks: dict[str, int]):
        self.ranks = ranks
        self.spans: list[tuple[str, int, int]] = []
        self._mask = None

    def set(self, spans: list[tuple[str, int, int]]) -> None:
        self.spans, self._mask = spans, None

    def mask(self, like):
        if self._mask is None or self._mask.dtype != like.dtype:
            cols = [self.ranks[name] for name, _, _ in self.spans]
            mask = like.new_zeros((self.spans[-1][2], sum(cols)))
            col = 0
            for (_, lo, hi), r in zip(self.spans, cols, strict=True):
                mask[lo:hi, col:col + r] = 1
                col += r
            self._mask = mask
        return self._mask if self._mask.device == like.device else self._mask.to(like.device)


def _routed_forward(self, x, *args, routing: _Routing, **kwargs):
    """A PEFT LoRA Linear's forward for a packed row of several cells: one base GEMM over every token, plus each
    token's own cell's update. The cells' A and B are stacked (A: all ranks x in, B scaled: out x all ranks) so the
    update is three kernels whatever the number of cells: h = x A^T for every token and every cell's rank, h masked
    to the token's own cell, then addmm(base, h, B^T) in the GEMM epilogue. The other cells' columns cost FLOPs
    (2 x tokens x ranks x (in + out), small beside the base GEMM) but no kernel launches; they are exact zeros, so
    each cell's output and gradients are its own. One cell: train_lora's fused forward."""
    import torch
    import torch.nn.functional as F

    autocast = torch.is_autocast_enabled(x.device.type)
    result = self.base_layer(x, *args, **kwargs)
    flat_x = x.reshape(-1, x.shape[-1])
    flat = result.reshape(-1, result.shape[-1])
    names = [name for name, _, _ in routing.spans]
    if len(names) == 1:
        a, b = self.lora_A[names[0]].weight, self.lora_B[names[0]].weight
        scale = self.scaling[names[0]]
    else:
        a = torch.cat([self.lora_A[n].weight for n in names])
        b = torch.cat([self.lora_B[n].weight * self.scaling[n] for n in names], dim=1)
        scale = 1.0
    if not autocast:
        flat_x, flat = flat_x.to(a.dtype), flat.to(a.dtype)
    h = F.linear(flat_x, a)
    if len(names) > 1:
        h = h * routing.mask(h)
    return torch.addmm(flat, h, b.t(), alpha=scale).to(result.dtype).view(result.shape)


def _lm_head_loss_sum(hidden, weight, labels):
    """Sum of the cross-entropy of `labels` (all real targets) under the LM head, in chunks whose logits are
    recomputed in backward: the (positions x vocabulary) logits of a whole micro-batch are never held."""
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    def chunk(h, y):
        return F.cross_entropy(F.linear(h, weight).float(), y, reduction="sum")

    total = hidden.new_zeros((), dtype=torch.float32)
    for lo in range(0, hidden.shape[0], LM_HEAD_CHUNK):
        h, y = hidden[lo:lo + LM_HEAD_CHUNK], labels[lo:lo + LM_HEAD_CHUNK]
        total = total + (checkpoint(chunk, h, y, use_reentrant=False) if h.requires_grad else chunk(h, y))
    return total


def _shared_pass(backbone, head, pieces: list[tuple[str, list[Tokenized]]], norms: list[int], routing: _Routing,
                 device, bf16: bool) -> list:
    """One forward and backward pass of several cells' micro-batches packed in one row (each through its own
    adapter); returns each piece's loss, detached. The pass's tensors die with this frame: kept alive in the
    caller's, they held their memory, and the cached segments they sit in, through the next pass's forward and
    through the hand-back of the cache after training (which an engine waking next needs)."""
    import torch

    inputs, labels, spans = _packed(pieces, device)
    routing.set(spans)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        hidden = backbone(**inputs, use_cache=False).last_hidden_state[0]
        loss = hidden.new_zeros((), dtype=torch.float32)
        parts = []
        for (_, lo, hi), h, norm in zip(spans, hidden.split([hi - lo for _, lo, hi in spans]), norms, strict=True):
            y = labels[lo + 1:hi]
            mask = y != IGNORE
            part = _lm_head_loss_sum(h[:-1][mask], head, y[mask]) / norm
            parts.append(part)
            loss = loss + part
    loss.backward()
    return [part.detach() for part in parts]


def _packed(pieces: list[tuple[str, list[Tokenized]]], device):
    """The packed row of several cells' micro-batches: model inputs, labels, and each cell's token span."""
    import torch

    ids, labels, pos, starts, spans = [], [], [], [], []
    for name, rows in pieces:
        lo = len(ids)
        for r in rows:
            starts.append(len(ids))
            ids += r.input_ids
            labels += [IGNORE, *r.labels[1:]]
            pos += range(len(r.input_ids))
        spans.append((name, lo, len(ids)))
    cu = torch.tensor([*starts, len(ids)], dtype=torch.int32)
    longest = int(cu.diff().max())
    inputs = {
        "input_ids": torch.tensor([ids], device=device),
        "position_ids": torch.tensor([pos], device=device),
        "cu_seq_lens_q": cu.to(device), "cu_seq_lens_k": cu.to(device),
        "max_length_q": longest, "max_length_k": longest,
    }
    return inputs, torch.tensor(labels, device=device), spans


def _forwards(pieces: list[tuple[int, list[Tokenized]]], budget: int | None) -> list[list[tuple[int, list[Tokenized]]]]:
    """Pieces (cell, micro-batch) of one round grouped into forward passes of at most `budget` tokens (a piece
    over budget alone in its pass: its cell's micro-batch was already cut to fit)."""
    out, size = [[]], 0
    for piece in pieces:
        n = sum(len(r.input_ids) for r in piece[1])
        if budget and out[-1] and size + n > budget:
            out.append([])
            size = 0
        out[-1].append(piece)
        size += n
    return out


def piece_tokens(r: Recipe) -> int:
    """The most tokens one micro-batch of the recipe can hold: its micro-batch size times its longest example."""
    longest = max(len(x.input_ids) for x in r.rows)
    return split_batch(r.batch_size, r.grad_accum, longest, r.max_batch_tokens)[0] * longest


def forward_budget(recipes: list[Recipe]) -> int:
    """Tokens one shared pass may hold: the largest max_batch_tokens of the recipes (a statement about the GPU the
    job's cells share, which the memory plan counts), and never less than the largest micro-batch one of them has
    alone. Without any max_batch_tokens, shared passes never need more memory than the largest cell alone."""
    return max(max((r.max_batch_tokens or 0 for r in recipes), default=0), max(map(piece_tokens, recipes)))


def cells_per_pass(recipes: list[Recipe]) -> float:
    """How many cells' micro-batches share one pass on average under forward_budget (1: nothing is shared)."""
    budget = forward_budget(recipes)
    pieces = [piece_tokens(r) for r in recipes]
    return len(pieces) / len(_forwards([(i, [Tokenized([0] * n, [])]) for i, n in enumerate(pieces)], budget))


def train_together(base, recipes: list[Recipe], varlen_attention: bool | None = None,
                   compile_layers: bool = False, on_step: list[StepLog | None] | None = None) -> list[TrainReport]:
    """Train every recipe's adapter on `base` (eps_screen.models.loading.BaseModel) in shared passes, save each to its
    out_dir with a train_report.json, and return the reports in order. The base is left as it was.
    compile_layers: torch.compile each decoder block (dynamic shapes), as train_lora's compile option does.
    on_step: per recipe, where each of its optimizer steps' figures go as train_lora's on_step gets them (its
    tokens/s: its own tokens over the shared step's wall time)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora.layer import Linear
    from transformers import get_scheduler

    from eps_screen.train.attention import use_varlen_attention

    keys = {together_key(r) for r in recipes}
    if None in keys or len(keys) != 1:
        raise ValueError("train_together: recipes must share one together_key (eps_screen.train.stages groups them)")
    base_model = base.model
    on_gpu = next(base_model.parameters()).is_cuda
    device = next(base_model.parameters()).device
    bf16 = on_gpu and next(base_model.parameters()).dtype == torch.bfloat16
    if varlen_attention is None:
        varlen_attention = on_gpu
    restore_attn = use_varlen_attention(base_model) if varlen_attention else None
    names = [f"cell{i}" for i in range(len(recipes))]
    peak = _DevicePeak() if on_gpu else None
    model = None
    layers = []
    routing = _Routing({name: r.rank for name, r in zip(names, recipes, strict=True)})
    passes = pieces_run = 0
    params, opts, scheds = {}, [], []
    try:
        for name, r in zip(names, recipes, strict=True):
            target = [m.strip() for m in r.target_modules.split(",")]
            lora = LoraConfig(r=r.rank, lora_alpha=r.alpha, lora_dropout=r.dropout,
                              target_modules=target[0] if target == ["all-linear"] else target, task_type="CAUSAL_LM")
            torch.manual_seed(r.seed)  # as train_lora: the adapter's initial A is drawn from this cell's seed
            if model is None:
                model = get_peft_model(base_model, lora, adapter_name=name)
            else:
                model.add_adapter(name, lora)
        for module in model.modules():
            if type(module) is Linear:
                module.forward = types.MethodType(
                    lambda self, x, *a, **k: _routed_forward(self, x, *a, routing=routing, **k), module)
        params.update({name: [] for name in names})
        for pname, p in model.named_parameters():
            owner = next((n for n in names if f".lora_A.{n}." in pname or f".lora_B.{n}." in pname), None)
            p.requires_grad_(owner is not None)
            if owner is not None:
                params[owner].append(p)
        plans = [schedule(r) for r in recipes]
        for name, r, plan in zip(names, recipes, plans, strict=True):
            opts.append(torch.optim.AdamW(params[name], lr=r.learning_rate, betas=ADAM_BETAS, eps=ADAM_EPS,
                                          weight_decay=0.0, fused=True))
            total = len(plan)
            warmup = int(r.warmup_ratio) if r.warmup_ratio >= 1 else math.ceil(total * r.warmup_ratio)
            scheds.append(get_scheduler("linear", opts[-1], num_warmup_steps=warmup, num_training_steps=total))
        backbone = model.base_model.model.get_decoder()
        head = model.base_model.model.get_output_embeddings().weight
        budget = forward_budget(recipes)
        layers = model.base_model.model.model.layers if compile_layers else []
        if layers:
            import torch._dynamo

            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            for layer in layers:
                layer.compile(dynamic=True)
        losses = [[] for _ in recipes]
        model.train()
        start = step_began = time.perf_counter()
        for k in range(max(len(p) for p in plans)):
            live = [i for i, p in enumerate(plans) if k < len(p)]
            norm = {i: max(1, _target_count([recipes[i].rows[j] for mb in plans[i][k] for j in mb])) for i in live}
            step_loss = {i: torch.zeros((), device=device) for i in live}
            for m in range(max(len(plans[i][k]) for i in live)):
                round_ = [(i, [recipes[i].rows[j] for j in plans[i][k][m]]) for i in live if m < len(plans[i][k])]
                for group in _forwards(round_, budget):
                    passes, pieces_run = passes + 1, pieces_run + len(group)
                    own = _shared_pass(backbone, head, [(names[i], rows) for i, rows in group],
                                       [norm[i] for i, _ in group], routing, device, bf16)
                    for (i, _), part in zip(group, own, strict=True):
                        step_loss[i] += part
            rates = {i: scheds[i].get_last_lr()[0] for i in live}  # this step's, as transformers logs it
            for i in live:
                torch.nn.utils.clip_grad_norm_(params[names[i]], MAX_GRAD_NORM)
                opts[i].step()
                scheds[i].step()
                opts[i].zero_grad(set_to_none=True)
                losses[i].append(step_loss[i])
            if on_step is not None:
                step_began = _report_step(k, live, plans, recipes, step_loss, rates, on_step, step_began)
        if on_gpu:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        losses = [[float(x) for x in cell] for cell in losses]
        for name, r in zip(names, recipes, strict=True):
            _save_adapter(model, name, r.out_dir)
    finally:
        for layer in layers:
            layer._compiled_call_impl = None  # the next run's LoRA layers are other modules
        if model is not None:
            model.unload()  # strips every cell's LoRA layers: base.model is the untouched base again
        if base_model.__dict__.get("peft_config") is not None:
            del base_model.peft_config
        if restore_attn:
            base_model.set_attn_implementation(restore_attn)
        for p in base_model.parameters():
            p.requires_grad_(False)
        base_model.eval()
        # The optimizers' fp32 moments (about 1 GB a cell at r=32 on a 7B base) die here, not when the function
        # returns: freed after the cache goes back, they would stay cached, out of reach of an engine waking next.
        del model
        params.clear()
        opts.clear()
        scheds.clear()
        release_cached_memory()
    device_gb, allocated_gb, own_gb = peak.gib() if peak else (None, None, None)
    all_tokens = sum(len(x.input_ids) * int(r.epochs) for r in recipes for x in r.rows)
    reports = []
    for r, plan, cell_losses in zip(recipes, plans, losses, strict=True):
        tokens = sum(len(x.input_ids) for x in r.rows)
        micro, accum = split_batch(r.batch_size, r.grad_accum, max(len(x.input_ids) for x in r.rows), r.max_batch_tokens)
        share = seconds * tokens * int(r.epochs) / all_tokens  # the shared passes, charged by tokens
        report = TrainReport(
            examples=len(r.rows), positives=r.positives, tokens=tokens,
            target_tokens=sum(sum(lbl != IGNORE for lbl in x.labels) for x in r.rows),
            steps=len(plan), seconds=share, tokens_per_s=tokens * int(r.epochs) / share if share else 0.0,
            final_loss=cell_losses[-1] if cell_losses else None, losses=cell_losses,
            peak_memory_gb=device_gb, peak_allocated_gb=allocated_gb, own_allocated_gb=own_gb, micro_batch=micro, grad_accum=accum,
            options={"bf16": bf16, "padding_free": True, "varlen_attention": bool(varlen_attention),
                     "fused_lora": True, "compile": bool(compile_layers), "liger": False, "together": len(recipes),
                     "together_seconds": seconds, "max_batch_tokens": budget,
                     "cells_per_pass": pieces_run / max(1, passes)},
        )
        (r.out_dir / "train_report.json").write_text(json.dumps(asdict(report), indent=1))
        reports.append(report)
    return reports


def _report_step(k: int, live: list[int], plans, recipes: list[Recipe], step_loss: dict, rates: dict,
                 on_step: list[StepLog | None], began: float) -> float:
    """Optimizer step k's figures to each live cell's on_step (the learning rate the step used, as train_lora's
    trainer logs it); returns when the step ended."""
    now = time.perf_counter()
    for i in live:
        if on_step[i] is not None:
            tokens = sum(len(recipes[i].rows[j].input_ids) for mb in plans[i][k] for j in mb)
            on_step[i](k + 1, {"loss": float(step_loss[i]), "learning_rate": float(rates[i]),
                               "tokens_per_s": tokens / (now - began) if now > began else 0.0})
    return now


def _save_adapter(model, name: str, out_dir: Path) -> None:
    """PEFT saves a named adapter into a subdirectory of that name: save there, then move its files up, so each
    cell's directory holds what train_lora's holds."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = out_dir / ".together"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, selected_adapters=[name])
    for f in (staging / name).iterdir():
        f.replace(out_dir / f.name)
    shutil.rmtree(staging)
