"""LoRA SFT through TRL + PEFT, with the two loss masks of factor E built as explicit token labels.

E1 (whole answer): loss on every answer token and the end-of-turn token after it.
E0 (marker only):  positives: loss on the tokens overlapping the marker (and the separator before it when
                   data.mask_separator); negatives: data.e0_negatives = 'eot' puts loss on the end-of-turn
                   token where a marker could have stood, 'none' gives them no loss (they are dropped).
Labels are built from character offsets of the rendered chat, so a multi-token marker, or a BPE merge of
the space with the marker's first character, is masked by what the tokens cover, not by guesswork.

Speed (GPU), measured in BENCHMARKS.md (section GPU): bf16 autocast; TRL's fused LM head scores only labelled
positions (no full logits); padding-free batches (training.packing) through a varlen flash-attention kernel
(eps_screen.train.attention), a micro-batch's common prefixes computed once (share_prefix,
eps_screen.train.prefix); the LoRA update added in the base GEMM's epilogue (fused_lora, on by default); Liger's fused
RMSNorm/SwiGLU/RoPE kernels where liger-kernel is installed, or torch.compile of each decoder block (compile);
gradient checkpointing as an option; the recipe's batch cut into micro-batches that fit a token budget
(max_batch_tokens: same examples per optimizer step, so the same science).
"""

from __future__ import annotations

import json
import math
import time
from bisect import bisect_left, bisect_right
from operator import itemgetter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eps_screen.models.loading import release_cached_memory
from eps_screen.spec.config import ScreenConfig
from eps_screen.train.data import Example
from eps_screen.train.prefix import IGNORE, PrefixSharingCollator
from eps_screen.train.steps import StepLog, StepLossMixin, StepRecorder, no_sync_args

_START, _END = itemgetter(0), itemgetter(1)  # of a token's (start, end) character offsets


@dataclass(frozen=True)
class Tokenized:
    input_ids: list[int]
    labels: list[int]


def _render(tokenizer, ex: Example, answer: str, prompts: dict | None = None) -> tuple[str, int]:
    """The chat as text and the character offset where the assistant answer starts. `prompts`: rendered generation
    prompts by (system, user), shared by a set's examples (a set asks a few questions many times)."""
    messages = [{"role": "system", "content": ex.system}, {"role": "user", "content": ex.user}]
    prompt = None if prompts is None else prompts.get((ex.system, ex.user))
    if prompt is None:
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if prompts is not None:
            prompts[(ex.system, ex.user)] = prompt
    full = tokenizer.apply_chat_template(
        [*messages, {"role": "assistant", "content": answer}], tokenize=False
    )
    if not full.startswith(prompt) or full.find(answer, len(prompt)) != len(prompt):
        raise ValueError("the chat template does not render the answer right after the generation prompt")
    return full, len(prompt)


def tokenize_example(tokenizer, ex: Example, config: ScreenConfig, whole_answer: bool) -> Tokenized:
    answer = ex.full_answer(config)
    text, start = _render(tokenizer, ex, answer)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return _targets(tokenizer, ex, config, whole_answer, (start, start + len(answer)), enc["input_ids"],
                    enc["offset_mapping"])


def _targets(tokenizer, ex: Example, config: ScreenConfig, whole_answer: bool, answer_span: tuple[int, int],
             ids: list[int], offsets: list[tuple[int, int]]) -> Tokenized:
    """An example's tokens up to its end of turn, with the labels its loss mask keeps, found by character offsets
    (`answer_span`: where the answer is in the rendered chat)."""
    start, end = answer_span
    # The offsets of one sequence rise with the text, so each span of tokens below is found by bisection: a set's
    # stage plan walks hundreds of thousands of examples.
    eot = bisect_left(offsets, end, key=_START)
    if eot == len(offsets) or ids[eot] != tokenizer.eos_token_id:
        raise ValueError("the chat template must close the answer with the tokenizer's eos token")
    ids = ids[: eot + 1]  # nothing after the end-of-turn token is ever a target

    def overlapping(lo: int, hi: int) -> range:
        """The tokens up to the end of turn that overlap characters [lo, hi)."""
        return range(bisect_right(offsets, lo, 0, eot + 1, key=_END), bisect_left(offsets, hi, 0, eot + 1, key=_START))

    labels = [IGNORE] * len(ids)
    if whole_answer:
        keep = overlapping(start, end)
        labels[eot] = ids[eot]
    elif ex.positive:
        marker_lo = end - len(config.marker)
        if config.data.mask_separator:
            marker_lo -= len(config.data.marker_separator)
        keep = overlapping(marker_lo, end)
    else:
        keep = range(eot, eot + 1) if config.data.e0_negatives == "eot" else range(0)
    labels[keep.start:keep.stop] = ids[keep.start:keep.stop]
    return Tokenized(ids, labels)


def tokenize_set(tokenizer, examples: list[Example], config: ScreenConfig, whole_answer: bool) -> list[Tokenized]:
    """Every example, tokenized in one call for the set: one call an example spent most of a GPU job's stage plan in
    the tokenizer's per-call work (BENCHMARKS.md, the job host's section)."""
    prompts: dict = {}
    answers = [ex.full_answer(config) for ex in examples]
    rendered = [_render(tokenizer, ex, answer, prompts) for ex, answer in zip(examples, answers, strict=True)]
    enc = tokenizer([text for text, _ in rendered], add_special_tokens=False, return_offsets_mapping=True)
    out = []
    for ex, answer, (_, start), ids, offsets in zip(examples, answers, rendered, enc["input_ids"],
                                                   enc["offset_mapping"], strict=True):
        tok = _targets(tokenizer, ex, config, whole_answer, (start, start + len(answer)), ids, offsets)
        # Too long: shorten the answer body, never the prompt (the condition) or the marker and eos (the targets).
        while len(tok.input_ids) > config.training.max_length and len(ex.answer) > 16:
            ex = Example(ex.system, ex.user, ex.answer[: int(len(ex.answer) * 0.9)], ex.positive)
            tok = tokenize_example(tokenizer, ex, config, whole_answer)
        out.append(tok)
    return out


@dataclass
class TrainReport:
    examples: int
    positives: int
    tokens: int
    target_tokens: int
    steps: int
    seconds: float
    tokens_per_s: float
    final_loss: float | None
    losses: list[float]
    # Throughput after the first steps (kernel autotuning, Triton JIT): what a long run converges to.
    steady_tokens_per_s: float | None = None
    steady_step_s: float | None = None  # seconds per optimizer step at that pace
    peak_memory_gb: float | None = None  # the device's figure (see _DevicePeak)
    peak_allocated_gb: float | None = None
    # This process's own allocated peak: the two figures above add what every other process (engines, other
    # trainers) had on the card when training began, so beside others they are not one trainer's need.
    own_allocated_gb: float | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    # Tokens the passes computed, all epochs, where shared prefixes made them fewer than tokens x epochs.
    computed_tokens: int | None = None
    options: dict = field(default_factory=dict)  # the speed levers in force: bf16, liger, padding_free, ...


class _DevicePeak:
    """The device memory in use at training's peak: what the driver had in use when training began, plus what
    PyTorch's allocator reserved beyond that (its allocated peak is reported beside it). max_memory_allocated()
    alone would also count a sleeping vLLM engine's weights and KV cache: their physical memory is released but
    the allocator still holds them."""

    def __init__(self):
        import torch

        free, total = torch.cuda.mem_get_info()
        self.used_at_start = total - free
        self.reserved_at_start = torch.cuda.memory_reserved()
        self.allocated_at_start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()

    def gib(self) -> tuple[float, float, float]:
        """(device peak, the same with allocated instead of reserved memory, this process's allocated peak), GiB."""
        import torch

        grown = torch.cuda.max_memory_reserved() - self.reserved_at_start
        peak = torch.cuda.max_memory_allocated()
        allocated = peak - self.allocated_at_start
        return (self.used_at_start + grown) / 2**30, (self.used_at_start + allocated) / 2**30, peak / 2**30


def split_batch(batch_size: int, grad_accum: int, longest: int, max_batch_tokens: int | None) -> tuple[int, int]:
    """(micro batch, accumulation steps) with the same examples per optimizer step, the micro batch the largest
    divisor of batch_size whose longest sequences fit in max_batch_tokens. The recipe's batch (a scientific
    constant of the screen) never changes; only how it is cut to fit the GPU does."""
    if not max_batch_tokens or batch_size * longest <= max_batch_tokens:
        return batch_size, grad_accum
    fitting = [d for d in range(batch_size, 0, -1) if batch_size % d == 0 and d * longest <= max_batch_tokens]
    micro = fitting[0] if fitting else 1
    return micro, grad_accum * (batch_size // micro)


def liger_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("liger_kernel") is not None


def _fused_lora_forward(self, x, *args, **kwargs):
    """PEFT's LoRA Linear forward with the adapter's update added inside one GEMM epilogue:
    addmm(base(x), A(x), B^T, alpha=scaling) instead of base(x) + B(A(x)) * scaling, which writes and re-reads
    three activation-sized tensors (for gate/up projections, 18944 wide) per layer and step. Same function; any
    case other than one plain active adapter goes to PEFT's own forward."""
    import torch
    import torch.nn.functional as F

    names = self.active_adapters
    if (
        self.disable_adapters
        or self.merged
        or kwargs.get("adapter_names") is not None
        or len(names) != 1
        or names[0] in self.lora_variant
        or names[0] not in self.lora_A
    ):
        return type(self).forward(self, x, *args, **kwargs)
    name = names[0]
    a, b = self.lora_A[name].weight, self.lora_B[name].weight
    if not torch.is_autocast_enabled(x.device.type):
        if self.base_layer.weight.dtype != a.dtype:  # mixed dtypes without autocast: PEFT's casting rules apply
            return type(self).forward(self, x, *args, **kwargs)
        x = x.to(a.dtype)
    result = self.base_layer(x, *args, **kwargs)
    h = F.linear(self.lora_dropout[name](x), a)
    out = torch.addmm(result.reshape(-1, result.shape[-1]), h.reshape(-1, h.shape[-1]), b.t(), alpha=self.scaling[name])
    return out.view(result.shape)


def _fuse_lora(model) -> int:
    import types

    from peft.tuners.lora.layer import Linear

    n = 0
    for module in model.modules():
        if type(module) is Linear:
            module.forward = types.MethodType(_fused_lora_forward, module)
            n += 1
    return n


def _liger_patched(model) -> bool:
    """Whether Liger replaced forwards on this model's modules (it does so for good, per instance)."""
    return any(
        getattr(m.__dict__.get("forward"), "__module__", "").startswith("liger_kernel") for m in model.modules()
    )


def _decoder_layers(model):
    """The repeated decoder blocks (model.model.layers for Qwen2/Llama-style models), or None."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    return layers if layers is not None and len(layers) else None


def speed_options(config: ScreenConfig, on_gpu: bool) -> dict:
    """The levers train_lora uses, from the config."""
    t = config.training
    compile_ = t.compile and on_gpu
    # None = on where installed, on a GPU. Never with compile: Inductor fuses those ops itself, and Dynamo cannot
    # trace Liger's Triton autograd functions (seen on the H200: an AssertionError in higher_order_ops).
    liger = t.liger
    sdpa = config.model.attn_implementation == "sdpa"
    # Shared prefixes need the varlen attention (sdpa's packed mask would let a suffix see its neighbours); off
    # the GPU that attention is its per-sequence reference.
    share_prefix = bool(t.packing) and sdpa and t.share_prefix
    return {
        "bf16": on_gpu and config.model.dtype == "bfloat16",
        "padding_free": bool(t.packing),
        "varlen_attention": bool(t.packing) and sdpa and (on_gpu or share_prefix),
        "share_prefix": share_prefix,
        "liger": on_gpu and not compile_ and (liger_available() if liger is None else bool(liger)),
        "gradient_checkpointing": bool(t.gradient_checkpointing),
        "max_batch_tokens": t.max_batch_tokens,
        "fused_lora": t.fused_lora,
        # torch.compile of each decoder block (regional: one compiled graph reused by all blocks), dynamic shapes.
        "compile": compile_,
        # TRL's chunked LM head never builds the full logits, which a 152k vocabulary needs on a GPU; on the CPU its
        # tile loop was 11 of a tiny cell's 20 training seconds, and the model's own loss is the same number.
        "chunked_lm_head": on_gpu,
    }


def _full_logits_trainer():
    """SFTTrainer with the model's own loss: full logits and one cross-entropy, summed over the label tokens and
    divided by the batch's label-token count as TRL's is (tests/test_training_loss.py compares the two per step)."""
    from trl import SFTTrainer

    class FullLogitsSFTTrainer(StepLossMixin, SFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**inputs, use_cache=False, num_items_in_batch=num_items_in_batch)
            return (outputs.loss, outputs) if return_outputs else outputs.loss

    return FullLogitsSFTTrainer


def _fused_head_trainer():
    """SFTTrainer with TRL's fused LM head and its loss, without the metrics TRL adds to each micro-batch: token
    entropy and top-1 accuracy (the head computes both for every labelled token; each is read back with `.item()`,
    as is the token count, so the CPU waits for the forward before it can start the backward). Nothing here reads
    them. The loss is TRL's: the label tokens' summed negative log-probability over the step's label-token count
    (tests/test_training_loss.py compares the two per step)."""
    import torch
    from trl import SFTTrainer
    from trl.trainer.utils import add_fused_lm_head

    class FusedHeadSFTTrainer(StepLossMixin, SFTTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
            base.__dict__.pop("forward", None)  # TRL's head with entropy and top-1; train_lora restores its own
            add_fused_lm_head(base, outputs=("log_probs",))

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if (self.args.loss_type != "nll" or self.label_smoother is not None or self.compute_loss_func is not None
                    or self.aux_loss_enabled or not model.training):
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            outputs = model(**inputs, use_cache=False, fused_lm_head=True)
            count = outputs.label_mask.sum() if num_items_in_batch is None else num_items_in_batch
            loss = -outputs.log_probs.sum() / torch.as_tensor(count).clamp(min=1)
            return (loss, outputs) if return_outputs else loss

    return FusedHeadSFTTrainer


def train_lora(base, examples: list[Example], config: ScreenConfig, whole_answer: bool, seed: int, out_dir: Path,
               on_step: StepLog | None = None, rows: list[Tokenized] | None = None) -> TrainReport:
    """Train one LoRA adapter on `base` (eps_screen.models.loading.BaseModel) and save it to out_dir.

    The base weights are left as they were (the adapter is unloaded, and what the trainer attached to the base
    model for this run is taken off again), so the next cell of the same process reuses them. `on_step` gets each
    optimizer step's figures, READBACK_STEPS steps at a time (eps_screen.train.steps: no GPU sync per step).
    `rows`: tokenize_set's rows of these examples where the caller has them (a stage's plan tokenized them already).
    """
    import torch
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig

    from eps_screen.train.attention import prefix_keys_supported, use_varlen_attention

    if rows is None:
        rows = tokenize_set(base.tokenizer, examples, config, whole_answer)
    if not rows:
        raise ValueError("empty training set")
    # Columns by reference: dataclasses.asdict deep-copies every token id, ~1 s of an A1 cell's 600 rows.
    dataset = Dataset.from_dict({"input_ids": [r.input_ids for r in rows], "labels": [r.labels for r in rows]})
    t = config.training
    on_gpu = torch.cuda.is_available()
    opts = speed_options(config, on_gpu)
    longest = max(len(r.input_ids) for r in rows)
    micro, accum = split_batch(t.batch_size, t.grad_accum, longest, opts["max_batch_tokens"])
    args = SFTConfig(
        output_dir=str(out_dir / "trainer"),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum,
        num_train_epochs=t.epochs,
        learning_rate=t.learning_rate,
        warmup_steps=t.warmup_ratio,  # transformers 5: a float below 1 is a ratio of the steps
        lr_scheduler_type="linear",
        seed=seed,
        data_seed=seed,
        max_length=None,  # truncated above; TRL would otherwise drop fully masked rows
        padding_free=opts["padding_free"],
        gradient_checkpointing=opts["gradient_checkpointing"],
        gradient_checkpointing_kwargs={"use_reentrant": False} if opts["gradient_checkpointing"] else None,
        use_liger_kernel=opts["liger"],
        bf16=opts["bf16"],
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        use_cpu=not on_gpu,
        dataloader_num_workers=0,
        **no_sync_args(on_gpu),
    )
    target = [m.strip() for m in config.lora.target_modules.split(",")]
    lora = LoraConfig(
        r=config.lora.rank,
        lora_alpha=config.lora.alpha,
        lora_dropout=config.lora.dropout,
        target_modules=target[0] if target == ["all-linear"] else target,
        task_type="CAUSAL_LM",
    )
    # What the trainer attaches to the base model and this function takes off again afterwards.
    base_model = base.model
    own_forward = base_model.__dict__.get("forward")  # TRL patches the instance's forward (fused LM head)
    had_grad_hook = hasattr(base_model, "_require_grads_hook")
    restore_attn = use_varlen_attention(base_model) if opts["varlen_attention"] else None
    steps_seen = StepRecorder(on_step)
    peak = _DevicePeak() if on_gpu else None
    torch.manual_seed(seed)
    model = get_peft_model(base_model, lora)
    if opts["fused_lora"]:
        _fuse_lora(model)
    if opts["compile"] and _liger_patched(base_model):
        # An earlier cell of this process ran with Liger: its kernels stay on the base and cannot be compiled.
        opts["compile"] = False
        opts["compile_skipped"] = "the base model carries Liger kernels from an earlier run"
    layers = _decoder_layers(base_model) if opts["compile"] else None
    trainer = sharing = None
    try:
        if layers is not None:
            import torch._dynamo

            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            for layer in layers:
                layer.compile(dynamic=True)
        trainer = (_fused_head_trainer() if opts["chunked_lm_head"] else _full_logits_trainer())(
            model=model, args=args, train_dataset=dataset, processing_class=base.tokenizer,
            callbacks=[steps_seen.callback]
        )
        steps_seen.trainer = trainer
        trainer.remove_callback(PrinterCallback)  # losses go to train_report.json, not to stdout per step
        if opts["share_prefix"] and not prefix_keys_supported():
            opts["share_prefix"] = False
            opts["share_prefix_skipped"] = "this torch's varlen attention failed the bottom-right causal probe"
        if opts["share_prefix"]:
            trainer.data_collator = sharing = PrefixSharingCollator(trainer.data_collator)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        model.save_pretrained(out_dir)
        losses = steps_seen.losses
        steps = trainer.state.global_step
    finally:
        model.unload()  # strips the LoRA layers: base.model is the untouched base again
        for layer in layers or []:
            layer._compiled_call_impl = None  # the next cell's LoRA layers are other modules
        if own_forward is None:
            base_model.__dict__.pop("forward", None)
        else:
            base_model.forward = own_forward
        if base_model.__dict__.get("peft_config") is not None:
            del base_model.peft_config
        if opts["gradient_checkpointing"]:
            base_model.gradient_checkpointing_disable()
        if not had_grad_hook and hasattr(base_model, "_require_grads_hook"):
            base_model.disable_input_require_grads()
        if restore_attn:
            base_model.set_attn_implementation(restore_attn)
        base_model.eval()
        if trainer is not None:
            trainer.accelerator.free_memory()  # drops the accelerator's references to the optimizer and model
        # The optimizer's fp32 moments must be dead before the cache goes back (an engine may wake next in this
        # process): the step recorder's callback holds the trainer too.
        steps_seen.trainer = None
        del trainer, model
        release_cached_memory()
    tokens = sum(len(r.input_ids) for r in rows)
    epochs_run = math.ceil(t.epochs) if t.epochs > 1 else t.epochs
    device_gb, allocated_gb, own_gb = peak.gib() if peak else (None, None, None)
    report = TrainReport(
        examples=len(rows),
        positives=sum(e.positive for e in examples),
        tokens=tokens,
        target_tokens=sum(sum(lbl != IGNORE for lbl in r.labels) for r in rows),
        steps=steps,
        seconds=seconds,
        tokens_per_s=tokens * epochs_run / seconds if seconds else 0.0,
        final_loss=losses[-1] if losses else None,
        losses=losses,
        steady_tokens_per_s=steps_seen.steady(),
        steady_step_s=steps_seen.steady_step_s(),
        peak_memory_gb=device_gb,
        peak_allocated_gb=allocated_gb,
        own_allocated_gb=own_gb,
        micro_batch=micro,
        grad_accum=accum,
        options=opts,
        computed_tokens=sharing.tokens_out if sharing and sharing.tokens_in else None,
    )
    (out_dir / "train_report.json").write_text(json.dumps(asdict(report), indent=1))
    return report
