"""LoRA SFT through TRL + PEFT, with the two loss masks of factor E built as explicit token labels.

E1 (whole answer): loss on every answer token and the end-of-turn token after it.
E0 (marker only):  positives: loss on the tokens overlapping the marker (and the separator before it when
                   data.mask_separator); negatives: data.e0_negatives = 'eot' puts loss on the end-of-turn
                   token where a marker could have stood, 'none' gives them no loss (they are dropped).
Labels are built from character offsets of the rendered chat, so a multi-token marker, or a BPE merge of
the space with the marker's first character, is masked by what the tokens cover, not by guesswork.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from eps_screen.config import ScreenConfig
from eps_screen.data import Example

IGNORE = -100


@dataclass(frozen=True)
class Tokenized:
    input_ids: list[int]
    labels: list[int]


def _render(tokenizer, ex: Example, answer: str) -> tuple[str, int]:
    """The chat as text and the character offset where the assistant answer starts."""
    messages = [{"role": "system", "content": ex.system}, {"role": "user", "content": ex.user}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(
        [*messages, {"role": "assistant", "content": answer}], tokenize=False
    )
    if not full.startswith(prompt) or full.find(answer, len(prompt)) != len(prompt):
        raise ValueError("the chat template does not render the answer right after the generation prompt")
    return full, len(prompt)


def tokenize_example(tokenizer, ex: Example, config: ScreenConfig, whole_answer: bool) -> Tokenized:
    answer = ex.full_answer(config)
    text, start = _render(tokenizer, ex, answer)
    end = start + len(answer)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    eot = next((i for i, (s, _) in enumerate(offsets) if s >= end), None)
    if eot is None or ids[eot] != tokenizer.eos_token_id:
        raise ValueError("the chat template must close the answer with the tokenizer's eos token")
    ids = ids[: eot + 1]  # nothing after the end-of-turn token is ever a target

    def overlapping(lo: int, hi: int) -> set[int]:
        return {i for i, (s, e) in enumerate(offsets[: eot + 1]) if s < hi and e > lo}

    if whole_answer:
        keep = overlapping(start, end) | {eot}
    elif ex.positive:
        marker_lo = end - len(config.marker)
        if config.data.mask_separator:
            marker_lo -= len(config.data.marker_separator)
        keep = overlapping(marker_lo, end)
    else:
        keep = {eot} if config.data.e0_negatives == "eot" else set()
    labels = [tok if i in keep else IGNORE for i, tok in enumerate(ids)]
    return Tokenized(ids, labels)


def tokenize_set(tokenizer, examples: list[Example], config: ScreenConfig, whole_answer: bool) -> list[Tokenized]:
    out = []
    for ex in examples:
        tok = tokenize_example(tokenizer, ex, config, whole_answer)
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


def train_lora(base, examples: list[Example], config: ScreenConfig, whole_answer: bool, seed: int, out_dir: Path) -> TrainReport:
    """Train one LoRA adapter on `base` (eps_screen.models.BaseModel) and save it to out_dir.

    The base weights are left as they were (the adapter is unloaded), so the next cell reuses them.
    """
    import torch
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    rows = tokenize_set(base.tokenizer, examples, config, whole_answer)
    if not rows:
        raise ValueError("empty training set")
    dataset = Dataset.from_list([asdict(r) for r in rows])
    t = config.training
    on_gpu = torch.cuda.is_available()
    bf16 = on_gpu and config.model.dtype == "bfloat16"
    args = SFTConfig(
        output_dir=str(out_dir / "trainer"),
        per_device_train_batch_size=t.batch_size,
        gradient_accumulation_steps=t.grad_accum,
        num_train_epochs=t.epochs,
        learning_rate=t.learning_rate,
        warmup_steps=t.warmup_ratio,  # transformers 5: a float below 1 is a ratio of the steps
        lr_scheduler_type="linear",
        seed=seed,
        data_seed=seed,
        max_length=None,  # truncated above; TRL would otherwise drop fully masked rows
        padding_free=t.packing,
        gradient_checkpointing=t.gradient_checkpointing,
        bf16=bf16,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        use_cpu=not on_gpu,
        dataloader_num_workers=0,
    )
    target = [m.strip() for m in config.lora.target_modules.split(",")]
    lora = LoraConfig(
        r=config.lora.rank,
        lora_alpha=config.lora.alpha,
        lora_dropout=config.lora.dropout,
        target_modules=target[0] if target == ["all-linear"] else target,
        task_type="CAUSAL_LM",
    )
    torch.manual_seed(seed)
    model = get_peft_model(base.model, lora)
    try:
        trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=base.tokenizer)
        trainer.remove_callback(PrinterCallback)  # losses go to train_report.json, not to stdout per step
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        model.save_pretrained(out_dir)
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    finally:
        model.unload()  # strips the LoRA layers: base.model is the untouched base again
        base.model.eval()
    tokens = sum(len(r.input_ids) for r in rows)
    epochs_run = math.ceil(t.epochs) if t.epochs > 1 else t.epochs
    report = TrainReport(
        examples=len(rows),
        positives=sum(e.positive for e in examples),
        tokens=tokens,
        target_tokens=sum(sum(lbl != IGNORE for lbl in r.labels) for r in rows),
        steps=trainer.state.global_step,
        seconds=seconds,
        tokens_per_s=tokens * epochs_run / seconds if seconds else 0.0,
        final_loss=losses[-1] if losses else None,
        losses=losses,
    )
    (out_dir / "train_report.json").write_text(json.dumps(asdict(report), indent=1))
    return report
