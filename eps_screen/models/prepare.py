"""What a config's models need on this machine before its first job, made now: packaged or GGUF weights converted
into the model cache, tiny models built. A job does each on first use otherwise, with the card waiting (on the
GPU machine, SmolLM2's conversion was part of the first job's 89 s before its first engine, tiny-alt's build about
27 s of the second job); `eps-screen models prepare CONFIG` does them while something else waits instead
(local-gpu-screen.sh runs it while the Prefect server starts; it also caches vLLM's facts on the models'
architectures: eps_screen.run.engines.ArchitectureLookups)."""

from __future__ import annotations

from eps_screen.models.packaged import PACKAGED, WeightsMissing, hf_dir, is_gguf, local_models, weights_problems
from eps_screen.models.tiny import build_screen_models, cache_root
from eps_screen.spec.config import ScreenConfig


def convert(config: ScreenConfig) -> list[str]:
    """The packaged or GGUF weights of each model the config loads on this machine, converted; one line each.
    WeightsMissing where a packaged model's file is not fetched, before anything is made."""
    refs = local_models(config)
    if problems := weights_problems(config):
        raise WeightsMissing("; ".join(problems))
    return [f"{ref}: converted, in {hf_dir(ref)}" for ref in refs if ref in PACKAGED or is_gguf(ref)]


def build(config: ScreenConfig) -> list[str]:
    """The tiny models the config loads on this machine, built; one line each."""
    if not local_models(config):
        return []
    return [f"{name}: built, in {cache_root()}" for name in build_screen_models(config, every=True)]
