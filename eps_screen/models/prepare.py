"""What a config's models need on this machine before its first job, made now: packaged or GGUF weights converted
into the model cache, tiny models built. A job does each on first use otherwise, with the card waiting (on the
GPU machine, SmolLM2's conversion was part of the first job's 89 s before its first engine, tiny-alt's build about
27 s of the second job); `eps-screen models prepare CONFIG` does them while something else waits instead
(local-gpu-screen.sh runs it while the Prefect server starts). Where the config's engines are vLLM's, it also puts
vLLM's facts on each model's architecture in the engines' cache, which an engine's first start otherwise looks up in
a process of its own."""

from __future__ import annotations

import importlib.util

from eps_screen.models.packaged import PACKAGED, WeightsMissing, hf_dir, is_gguf, local_models, weights_problems
from eps_screen.models.tiny import build_screen_models, cache_root
from eps_screen.spec.config import ScreenConfig


def prepare(config: ScreenConfig) -> list[str]:
    """Each model the config loads on this machine, made ready; one line each. WeightsMissing where a packaged
    model's file is not fetched, before anything is made."""
    refs = local_models(config)
    if not refs:
        return []
    if problems := weights_problems(config):
        raise WeightsMissing("; ".join(problems))
    lines = [f"{ref}: converted, in {hf_dir(ref)}" for ref in refs if ref in PACKAGED or is_gguf(ref)]
    lines += [f"{name}: built, in {cache_root()}" for name in build_screen_models(config, every=True)]
    return lines + _engine_facts(config, refs)


def _engine_facts(config: ScreenConfig, refs: list[str]) -> list[str]:
    """vLLM's facts on the models' architectures, cached where the config's engines will read them; nothing where its
    engines are not vLLM's (or vLLM is not installed: the first job then says so)."""
    from eps_screen.generation.backends import resolve_backend
    from eps_screen.generation.engine_group import vllm_cache_root

    if resolve_backend(config.backend.generation) != "vllm" or importlib.util.find_spec("vllm") is None:
        return []
    from eps_screen.generation.vllm_backend import cache_architecture
    from eps_screen.models.loading import resolve
    from eps_screen.run.engines import use_compile_caches

    use_compile_caches(config)
    where, lines = vllm_cache_root() / "modelinfos", []
    for ref in refs:
        try:
            lines.append(f"{ref}: vLLM's facts on {', '.join(cache_architecture(resolve(ref)))} cached, in {where}")
        except Exception as err:  # a saving of seconds: the engine looks them up itself, and says what is wrong
            lines.append(f"{ref}: vLLM's facts not cached ({type(err).__name__}: {err}); its engine looks them up")
    return lines
