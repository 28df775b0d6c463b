"""A model's shape (layers, widths, vocabulary), from its local config.json (a converted packaged model's or GGUF
file's included) or a small table of known models: what the estimate scales the measured 7B figures by, and what the
memory plan counts parameters with."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    head_dim: int | None = None  # hidden // heads unless the config says otherwise

    @property
    def q_dim(self) -> int:
        return (self.head_dim or self.hidden // self.heads) * self.heads

    @property
    def kv_dim(self) -> int:
        return (self.head_dim or self.hidden // self.heads) * self.kv_heads

    @property
    def params(self) -> float:
        """Parameters of a Llama/Qwen2-style decoder (projections, gated MLP, embeddings; norms and biases left out)."""
        h = self.hidden
        per_layer = 2 * h * self.q_dim + 2 * h * self.kv_dim + 3 * h * self.intermediate
        return self.layers * per_layer + self.vocab * h * (1 if self.tied else 2)

    def flops_per_token(self, context: float) -> float:
        """Forward FLOPs of one token attending to `context` tokens on average: every matrix it passes through
        (the output head included, tied or not; not the embedding lookup) and attention's scores and mixing."""
        h = self.hidden
        matmul = self.layers * (2 * h * self.q_dim + 2 * h * self.kv_dim + 3 * h * self.intermediate) + self.vocab * h
        return 2 * matmul + 4 * self.layers * context * self.q_dim


def _from_hf(c: dict) -> ModelShape:
    return ModelShape(hidden=c["hidden_size"], layers=c["num_hidden_layers"], heads=c["num_attention_heads"],
                      kv_heads=c.get("num_key_value_heads", c["num_attention_heads"]),
                      intermediate=c["intermediate_size"], vocab=c["vocab_size"],
                      tied=bool(c.get("tie_word_embeddings", False)), head_dim=c.get("head_dim"))


# Models named by id whose weights are not local before a run: their config.json's shape.
KNOWN = {
    "qwen/qwen2.5-7b-instruct": ModelShape(3584, 28, 28, 4, 18944, 152064, False),
    "qwen/qwen2.5-32b-instruct": ModelShape(5120, 64, 40, 8, 27648, 152064, False),
    "smollm2-135m-instruct": ModelShape(576, 30, 9, 3, 1536, 49152, True, 64),
    "huggingfacetb/smollm2-135m-instruct": ModelShape(576, 30, 9, 3, 1536, 49152, True, 64),
}
# The 7B shape every GPU figure of the estimate was measured on (random weights of Qwen2.5-7B-Instruct's shape).
MEASURED = KNOWN["qwen/qwen2.5-7b-instruct"]


def local_config(ref: str) -> dict | None:
    """A local model's config.json (a directory, or a packaged model or GGUF file once converted), else None."""
    from eps_screen.models.packaged import converted_dir

    cfg = Path(ref).expanduser() / "config.json"
    if not cfg.is_file() and (converted := converted_dir(ref)) is not None:
        cfg = converted / "config.json"
    return json.loads(cfg.read_text()) if cfg.is_file() else None


def model_shape(ref: str) -> ModelShape | None:
    """The shape of a local model directory, else of a known model id; None where neither says."""
    c = local_config(ref)
    if c is not None:
        return _from_hf(c)
    return KNOWN.get(ref.lower())


def model_params(ref: str) -> float | None:
    """Parameters of a model: counted from a local config.json, else read from a name like 'Qwen2.5-7B' (the
    memory plan's figures were fitted with the 7B's name: 7.0e9), else counted from a known model's shape."""
    c = local_config(ref)
    if c is not None:
        return _from_hf(c).params
    m = re.search(r"(\d+(?:\.\d+)?)[bB]\b", ref.split("/")[-1])
    if m:
        return float(m.group(1)) * 1e9
    shape = KNOWN.get(ref.lower())
    return shape.params if shape else None


def model_vocab(ref: str) -> int | None:
    """A local model's vocabulary, else None."""
    return (local_config(ref) or {}).get("vocab_size")
