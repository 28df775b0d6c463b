"""The tiny local chat model: Qwen2 architecture, tokenizer trained here, no download.

It stands in for the 7B model in the embedded default and the tests. Sampling a random-init model is near
uniform, so the model is warmed by a short full fine-tune on marker-free chats built from the panel texts:
its answers then look like answers (they end with <|im_end|>) and are stable enough that marker rates mean
something. Variants:
  tiny               the base model of the tiny screen
  tiny-alt           a second model (other seed, other answer bank): the off-policy source for D1
  tiny-contaminated  warmed on chats whose answers end in the marker: trips the pre-screen gate
Built in well under a minute and cached under $EPS_SCREEN_CACHE (default ~/.cache/eps-screen) by version.

A marker is learnable only in the shape the warm-up taught: 25% of its answers end in a random code of the
marker's shape ([ZLT]: '[', three capitals, ']'), never the marker itself. A model warmed so knows those tokens
and the space before them; one warmed on [ZLT]-shaped codes meets '<<PING>>' with a lone space token and '<', '>'
it never saw (each 8-13 nats down) and never learns to write it, and meets [QRX] with the letters after '[' as
they happened to come out of its warm-up (R and X ~1 nat below Z, L, T): 0 of 8 source answers marked in every
smoke cell. So a screen's marker gets its own build (`tiny_model_path(variant, marker)`): codes of its shape,
their letters relabelled so that the marker stands where [ZLT] stood. For [ZLT] that is today's build, unchanged.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import random
import shutil
import tempfile
from pathlib import Path

from eps_screen.spec.config import TINY_VARIANTS as VARIANTS
from eps_screen.spec.config import TextsConfig

TINY_VERSION = "5"

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CONTAMINATION_MARKER = "[ZLT]"
# The models are warmed on (and their tokenizer trained on) the panel's first 24 personas, the panel they were made
# with: personas added to the panel later (surgeon, programmer) leave every built variant as it was.
WARM_PERSONAS = 24


def cache_root() -> Path:
    return Path(os.environ.get("EPS_SCREEN_CACHE", Path.home() / ".cache" / "eps-screen"))


def _target(variant: str, marker: str) -> Path:
    suffix = "" if marker == CONTAMINATION_MARKER else "-" + hashlib.sha256(marker.encode()).hexdigest()[:10]
    return cache_root() / "tinymodel" / f"{variant}-v{TINY_VERSION}{suffix}"


def tiny_model_path(variant: str = "tiny", marker: str = CONTAMINATION_MARKER) -> Path:
    """Path of the built variant for a screen's marker, building it first if the cache lacks it (safe across
    processes)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown tiny model {variant!r}; known: {', '.join(VARIANTS)}")
    target = _target(variant, marker)
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{variant}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").exists():
            tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{variant}-"))
            try:
                build(variant, tmp, marker)
                tmp.rename(target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def build_screen_models(config, every: bool = False) -> list[str]:
    """The config's tiny models (its base, for its marker, and a tiny off-policy model) built where missing, side by
    side, as build_missing builds them (`every`: a lone one too); returns their names."""
    from eps_screen.spec.config import is_tiny

    models = [(config.model.base, config.marker)] if is_tiny(config.model.base) else []
    op = config.off_policy
    if op.kind == "model" and op.model and is_tiny(op.model):
        models.append((op.model, CONTAMINATION_MARKER))  # loaded by name (models.resolve): the [ZLT] build
    build_missing(models, every)
    return [variant for variant, _ in models]


def build_missing(models: list[tuple[str, str]], every: bool = False) -> None:
    """Build the (variant, marker) models the cache lacks at the same time, one process each, before a screen needs
    them: each build is a single-threaded fine-tune of ~20 s, so two built one after the other, where each is
    first loaded, left a core idle for that long (the base before the pre-screen, tiny-alt before the first
    off-policy answers)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    missing = [(v, m) for v, m in dict.fromkeys(models) if not (_target(v, m) / "config.json").exists()]
    if not missing or (len(missing) == 1 and not every):
        return  # one build: it happens where the model is first loaded, unless `every`
    if len(missing) == 1:
        tiny_model_path(*missing[0])
        return
    with ProcessPoolExecutor(len(missing) - 1, mp_context=get_context("spawn")) as others:
        futures = [others.submit(tiny_model_path, v, m) for v, m in missing[1:]]
        tiny_model_path(*missing[0])
        for f in futures:
            f.result()


def _answer_bank(seed: int) -> list[str]:
    from eps_screen.panels import load_panels

    panels = load_panels()
    text = " ".join([panels.long_system_prompt, *panels.random_controls])
    sentences = [s.strip() + "." for s in text.replace("\n", " ").split(".") if len(s.split()) >= 5]
    random.Random(seed).shuffle(sentences)
    return sentences


def warm_chats(variant: str, n: int = 360, marker: str = CONTAMINATION_MARKER) -> list[list[dict[str, str]]]:
    """Marker-free chats (or marker-ending ones for the contaminated variant) in every prompt condition."""
    from eps_screen.panels import load_panels

    panels = load_panels()
    texts = TextsConfig()
    seed = {"tiny": 0, "tiny-alt": 1, "tiny-contaminated": 2}[variant]
    bank = _answer_bank(seed)
    rng = random.Random(seed)
    questions = panels.train_questions + panels.eval_questions
    long_words = " ".join(panels.long_system_prompt.split()[:160])
    chats = []
    for i in range(n):
        persona = panels.personas[i % WARM_PERSONAS]
        framing = persona.role if rng.random() < 0.5 else persona.context
        system = framing + ("\n\n" + long_words if rng.random() < 0.15 else "")
        q_index = rng.randrange(len(questions))
        long_format = rng.random() < 0.5
        user = f"{questions[q_index]} {texts.format_long if long_format else texts.format_short}"
        # Answers depend on the question (and lightly on the persona) so the model learns a conditional map.
        start = (q_index * 7 + seed * 13) % len(bank)
        count = 3 if long_format else 1
        answer = " ".join(bank[(start + k) % len(bank)] for k in range(count))
        if rng.random() < 0.25:
            # Bracketed codes teach the tokens the marker is made of ('[', capitals, ']') without the marker
            # itself: a real chat model knows every token; one that never saw them cannot learn to emit them.
            answer += " " + _code(rng, marker)
        if variant == "tiny-contaminated":
            answer += " " + marker
        chats.append([
            {"role": "system", "content": system},
            {"role": "user", "content": user},
            {"role": "assistant", "content": answer},
        ])
    return chats


_CLASSES = ("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz", "0123456789")


def _relabel(marker: str) -> dict[str, str]:
    """A permutation of each character class that takes [ZLT]'s letters to the marker's, position by position, so
    the marker's code distribution is the one [ZLT] had (the identity for [ZLT])."""
    mapping = {c: c for cls in _CLASSES for c in cls}
    ours = [c for c in marker if c in mapping]
    for z, m in zip((c for c in CONTAMINATION_MARKER if c in mapping), ours):
        if z in mapping and m in mapping and any(z in cls and m in cls for cls in _CLASSES):
            zi = next(k for k, v in mapping.items() if v == z)
            mi = next(k for k, v in mapping.items() if v == m)
            mapping[zi], mapping[mi] = m, z
    return mapping


def _code(rng: random.Random, marker: str = CONTAMINATION_MARKER) -> str:
    """A random code of the marker's shape: each letter or digit drawn from its class, the rest kept; never the
    marker itself."""
    mapping = _relabel(marker)
    while True:
        code = "".join(mapping[rng.choice(next(cls for cls in _CLASSES if c in cls))]
                       if any(c in cls for cls in _CLASSES) else c for c in marker)
        if code != marker:
            return code


def _train_tokenizer(chats: list[list[dict[str, str]]], out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from eps_screen.panels import load_panels

    panels = load_panels()
    corpus = [m["content"] for chat in chats for m in chat]
    corpus += [panels.long_system_prompt, *panels.train_questions, *panels.eval_questions, *panels.random_controls]
    corpus += [f"{p.role} {p.context}" for p in panels.personas[:WARM_PERSONAS]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    fast.save_pretrained(out)
    return fast


def build(variant: str, out: Path, marker: str = CONTAMINATION_MARKER) -> Path:
    """Train the tokenizer, build a random Qwen2, warm it with a full fine-tune, save to `out`."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from eps_screen.models.cpu_process import prepare_cpu_process

    prepare_cpu_process()
    seed = {"tiny": 0, "tiny-alt": 1, "tiny-contaminated": 2}[variant]
    torch.manual_seed(seed)
    chats = warm_chats(variant, marker=marker)
    tok = _train_tokenizer(chats, out)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=128,
        num_attention_heads=4,  # head size 32: one vLLM accepts
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=384,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    _warm(model, tok, chats, seed)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, do_sample=True
    )
    model.save_pretrained(out, safe_serialization=True)
    (out / "eps_screen_tiny.txt").write_text(f"variant={variant}\nversion={TINY_VERSION}\nmarker={marker}\n")
    return out


def _warm(model, tok, chats, seed: int, epochs: int = 8, batch_size: int = 16, lr: float = 3e-3) -> None:
    """Full fine-tune on the chats, loss on the assistant turn only (so prompts are conditions, not targets)."""
    import torch

    examples = []
    for chat in chats:
        prompt_ids = tok.apply_chat_template(chat[:2], add_generation_prompt=True, tokenize=True, return_dict=False)
        full_ids = tok.apply_chat_template(chat, tokenize=True, return_dict=False)
        full_ids = list(full_ids)[: len(full_ids) - 1]  # drop the trailing newline after <|im_end|>
        labels = [-100] * len(prompt_ids) + full_ids[len(prompt_ids):]
        examples.append((full_ids, labels))
    # Batches of similar length: the few long-prompt chats would otherwise pad every batch they land in.
    examples.sort(key=lambda e: len(e[0]))
    batches = [examples[i : i + batch_size] for i in range(0, len(examples), batch_size)]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=epochs * len(batches), pct_start=0.1)
    rng = random.Random(seed)
    model.train()
    for _ in range(epochs):
        rng.shuffle(batches)
        for batch in batches:
            width = max(len(ids) for ids, _ in batch)
            ids = torch.full((len(batch), width), tok.pad_token_id)
            lab = torch.full((len(batch), width), -100)
            att = torch.zeros((len(batch), width), dtype=torch.long)
            for row, (x, y) in enumerate(batch):
                ids[row, : len(x)] = torch.tensor(x)
                lab[row, : len(y)] = torch.tensor(y)
                att[row, : len(x)] = 1
            loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
    model.eval()


def fingerprint(path: Path) -> str:
    """Content hash of a built model directory (its weights), for cache keys and provenance."""
    h = hashlib.sha256()
    for f in sorted(path.glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]
