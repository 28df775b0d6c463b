"""Shared pieces of the GPU benchmarks: the 7B-shaped random model, the environment record, result files.

The model has Qwen2.5-7B-Instruct's shapes (hidden 3584, 28 layers, 28 heads, 4 KV heads, intermediate 18944,
vocab 152064) and random weights: nothing is downloaded, and throughput depends on shapes, not on weights.
It is built on the GPU directly, in bf16 (a CPU init of 7.6B parameters takes minutes).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
import threading
from importlib import metadata
from pathlib import Path

QWEN7B_SHAPE = dict(
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
# The tiny shape stands in for it on a CPU dry run (--tiny): the same code paths in seconds.
TINY_SHAPE = dict(QWEN7B_SHAPE, vocab_size=2048, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
H200_BF16_PEAK = 989e12  # dense bf16 FLOP/s of the H100/H200 datasheet: the MFU denominator


def build_model(tiny: bool = False, layers: int | None = None, attn: str = "sdpa", vocab: int | None = None):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    shape = dict(TINY_SHAPE if tiny else QWEN7B_SHAPE)
    if layers:
        shape["num_hidden_layers"] = layers
    if vocab:
        shape["vocab_size"] = vocab
    config = Qwen2Config(**shape)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    model.eval()
    return model


def seven_b_dir(path: Path, tiny: bool = False, full_vocab: bool = False) -> Path:
    """A local model directory of the 7B shape with random bf16 weights and the tiny model's tokenizer and chat
    template (no download; prompts are real text through the chat template). The vocabulary is sized to that
    tokenizer (2,048 tokens: against Qwen2.5-7B's 152,064 the LM head is ~7% of the FLOPs smaller, and the sampler
    draws from 74x fewer logits), or with `full_vocab` the model keeps Qwen2.5-7B's and the tokenizer is padded
    with added tokens to match it: random weights sample all of them, so every id must decode. Built once per
    machine."""
    import torch
    from transformers import AutoTokenizer

    from eps_screen.models.tiny import tiny_model_path

    path = Path(path)
    if (path / "config.json").exists() and any(path.glob("*.safetensors")):
        return path
    tok = AutoTokenizer.from_pretrained(tiny_model_path("tiny"))
    model = build_model(tiny=tiny, vocab=QWEN7B_SHAPE["vocab_size"] if full_vocab else None)
    if full_vocab:
        pad_tokenizer(tok, model.config.vocab_size)
    else:
        model.resize_token_embeddings(len(tok))
        model.config.vocab_size = len(tok)
    model.config.eos_token_id = tok.eos_token_id
    model.config.bos_token_id = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    tmp = path.with_name(path.name + ".partial")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(path)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return path


def pad_tokenizer(tok, vocab: int) -> None:
    """Added tokens up to `vocab` ids: a random model of that vocabulary samples every id, and each must decode."""
    tok.add_tokens([f"<|vocab {i}|>" for i in range(len(tok), vocab)])


def random_adapter(base, out_dir: Path, rank: int = 8, alpha: float = 16, std: float = 0.2, seed: int = 0) -> str:
    """A LoRA adapter shaped like train_lora's (all linear layers) with random non-zero B, saved by PEFT: its
    answers differ from the base model's, which is all a speed or routing check needs (training one takes longer).
    The base (eps_screen.models.loading.BaseModel) is left as it was."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = get_peft_model(base.model, LoraConfig(r=rank, lora_alpha=alpha, target_modules="all-linear",
                                                  task_type="CAUSAL_LM"))
    try:
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=std)
        model.save_pretrained(out_dir)
    finally:
        model.unload()
        if base.model.__dict__.get("peft_config") is not None:
            del base.model.peft_config
    return str(out_dir)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def environment() -> dict:
    import torch

    versions = {}
    for lib in ("torch", "transformers", "peft", "trl", "accelerate", "datasets", "liger-kernel", "triton", "flash-attn"):
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    gpu = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        gpu = {"name": p.name, "memory_gb": round(p.total_memory / 2**30, 1), "sms": p.multi_processor_count}
    return {
        "date": dt.date.today().isoformat(),
        "run_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "python": platform.python_version(),
        "host": platform.node(),
        "gpu": gpu,
        "versions": versions,
    }


class DevicePeak:
    """The most device memory in use (the driver's figure) while the block runs, sampled in a thread.
    torch.cuda.max_memory_allocated() would also count a sleeping vLLM engine's released memory."""

    def __init__(self, every_s: float = 0.2):
        self.every_s, self.peak, self._stop = every_s, 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import torch

        while torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            self.peak = max(self.peak, total - free)
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> DevicePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def gib(self) -> float | None:
        return self.peak / 2**30 if self.peak else None  # None on a CPU dry run


def out_dir(default: str = "benchmarks/results") -> Path:
    """$OUT on the device machine (files there come back), else benchmarks/results."""
    path = Path(os.environ.get("OUT") or default)
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_files(root: Path) -> int:
    """How many files a compile cache directory holds (its subdirectories, made before any compile, not counted)."""
    return sum(1 for p in Path(root).rglob("*") if p.is_file()) if Path(root).is_dir() else 0


def write(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    tmp.replace(path)


def record_failure(payload: dict, what: str, err: Exception) -> None:
    """One run of a benchmark failed: say so, keep its traceback on the console and its message in the result file,
    and free what it held on the GPU, so that the runs after it are still measured."""
    import traceback

    msg = f"{what}: {type(err).__name__}: {err}"
    print("FAILED", msg, flush=True)
    traceback.print_exc()
    payload["errors"].append(msg[:2000])
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def add_engine_args(extra: dict) -> None:
    """The backend builds `vllm.LLM` from the config; a knob it does not expose is added here, for this process."""
    import vllm

    llm = vllm.LLM

    def with_extra(**kwargs):
        return llm(**{**kwargs, **extra})

    vllm.LLM = with_extra


def job_config(model_dir: Path, store: Path, *, engine_cache: Path | None = None, reduced: bool = True,
               overrides: dict | None = None, **sections):
    """qwen7b.yaml on the 7B-shaped local model, with smaller data and panel sizes unless not `reduced` (`sections`
    are merged into their sections, then `overrides` set by dotted path, e.g. {"training.share_prefix": False}):
    the GPU job of the GPU-tier test and of benchmarks/gpu_job_bench.py."""
    import yaml

    from eps_screen.spec.config import parse_config

    root = Path(__file__).resolve().parents[1]
    data = yaml.safe_load((root / "deployments" / "configs" / "qwen7b.yaml").read_text())
    data["model"]["base"] = str(model_dir)
    data["store"] = str(store)
    data["backend"] = {"generation": "vllm", "training": "trl"}
    data["execution"]["pool"] = "local-gpu"
    if reduced:
        data["data"].update(positives=50, negatives=100)
        data["training"].update(epochs=1)
        data["eval"].update(samples=2, max_new_tokens=128)
        data["execution"].update(cells_per_job=4, max_parallel_cells=1)
    if engine_cache:
        data["execution"]["engine_cache_dir"] = str(engine_cache)
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    for path, value in (overrides or {}).items():
        *parents, leaf = path.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return parse_config(data)  # a misspelt field is an error here: the config's sections are strict


def job_cells() -> list:
    """Four cells of one source: two regimes (A0 and A1 prompts, on-policy) x both loss masks (E0, E1)."""
    from eps_screen.spec.design import Cell

    return [Cell("librarian", (a, 0, 0, 0, e), 42) for a in (0, 1) for e in (0, 1)]
