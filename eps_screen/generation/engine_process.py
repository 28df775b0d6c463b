"""A generation engine in a process of its own: on a GPU, the off-policy model's.

vLLM's sleep mode keeps one memory allocator per process, and its sleep and wake act on every allocation in it
(vLLM 0.26: `CuMemAllocator.sleep` offloads or unmaps every allocation it holds, asleep or not, and `wake_up`
maps them all back). Two engines that sleep therefore cannot share a process: the off-policy model's engine
putting itself to sleep would copy from, and unmap, the base engine's memory that its own sleep had already
given back. So the job's process keeps the base model's engine, and the off-policy model's runs here, in a child
process: closing it ends that process, which gives every byte of its device and pinned host memory back.

The child builds the same generator a process would build for itself (backends.make_generator) and answers
`generate_many` calls over a pipe; an error there comes back with its traceback.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import time
from collections.abc import Sequence

from eps_screen.generation import GenerationParams, Prompt


# What each backend's engine imports (vLLM's top level loads its engine lazily, at `from vllm import LLM`).
_ENGINE_MODULES = {"vllm": ("vllm.entrypoints.llm", "vllm.lora.request"), "transformers": ("transformers", "peft")}


def _serve(conn, backend: str, model_ref: str, config) -> None:
    import importlib
    import traceback

    began = time.perf_counter()
    try:
        from eps_screen.generation.backends import make_generator, resolve_backend

        # Imported here, apart from the engine's build, to time them: what the child's start costs beyond the
        # engine's is the job's bill (41 s a job on the H200), and imports are the part that could start earlier.
        for module in _ENGINE_MODULES.get(resolve_backend(backend), ()):
            importlib.import_module(module)
        imported = time.perf_counter()
        gen = make_generator(backend, model_ref, config)
    except BaseException:  # noqa: BLE001 - the parent raises it with this traceback
        conn.send(("error", traceback.format_exc()))
        return
    stats = {**getattr(gen, "stats", {}), "child_import_s": imported - began,
             "child_build_s": time.perf_counter() - imported}
    conn.send(("ok", None, stats))
    try:
        while True:
            try:
                request = conn.recv()
            except EOFError:  # the parent is gone
                break
            if request is None:
                break
            try:
                out = gen.generate_many(*request)
                conn.send(("ok", out, dict(getattr(gen, "stats", {}))))
            except BaseException:  # noqa: BLE001
                conn.send(("error", traceback.format_exc()))
    finally:
        closing = time.perf_counter()
        gen.close()
        try:
            conn.send(("closed", time.perf_counter() - closing))  # the engine's shutdown, apart from the exit
        except (BrokenPipeError, OSError):
            pass


class ProcessGenerator:
    """The Generator interface over an engine in a child process (spawned: the parent has CUDA and threads)."""

    def __init__(self, backend: str, model_ref: str, config):
        context = multiprocessing.get_context("spawn")
        self.model_ref = model_ref
        self.name = f"{backend} (own process)"
        self._conn, child = context.Pipe()
        started = time.perf_counter()
        # Not a daemon: the engine may start processes of its own. At this process's exit multiprocessing joins it,
        # while it waits on a pipe this process still holds: a job that failed before releasing the engine would
        # never exit (on a local GPU, holding the card; RunPod's worker ends the pod once the run is final). So a
        # finalizer that runs before that join (exitpriority), or when this object is dropped, ends the child;
        # close() is that finalizer.
        self.process = context.Process(target=_serve, args=(child, backend, model_ref, config),
                                       name=f"engine {model_ref}")
        self.process.start()
        child.close()
        self._end = multiprocessing.util.Finalize(self, _end_child, args=(self._conn, self.process), exitpriority=10)
        self.stats: dict = {}
        self._reply()
        self.stats["process_start_s"] = time.perf_counter() - started

    def _reply(self):
        try:
            status, *rest = self._conn.recv()
        except EOFError:
            self.process.join(5)
            raise RuntimeError(f"the engine process of {self.model_ref} ended (exit code {self.process.exitcode})") \
                from None
        if status == "error":
            raise RuntimeError(f"the engine process of {self.model_ref} failed:\n{rest[0]}")
        out, stats = rest
        self.stats.update(stats)
        return out

    def generate(self, prompts: Sequence[Prompt], params: GenerationParams, adapter: str | None = None):
        return self.generate_many([(prompts, adapter)], params)[0]

    def generate_multi(self, prompts: Sequence[Prompt], params: GenerationParams, adapters: Sequence[str | None]):
        return self.generate_many([(prompts, a) for a in adapters], params)

    def generate_many(self, jobs, params):
        self._conn.send(([(list(prompts), adapter) for prompts, adapter in jobs], params))
        return self._reply()

    def release(self) -> bool:
        """End the engine's process: all its memory given back."""
        started = time.perf_counter()
        shutdown_s = self._end()
        self.stats["release_s"] = time.perf_counter() - started
        if shutdown_s is not None:
            self.stats["child_shutdown_s"] = shutdown_s
        return True

    def close(self) -> None:
        self._end()


def _end_child(conn, process) -> float | None:
    """Ask the child to end (its engine shuts down), and stop it if it does not; returns the seconds its engine's
    shutdown took, where it said."""
    shutdown_s = None
    if process.is_alive():
        try:
            conn.send(None)
            if conn.poll(120):
                _, shutdown_s = conn.recv()
        except (BrokenPipeError, EOFError, OSError):
            pass
        process.join(120)
    if process.is_alive():
        process.terminate()
        process.join(10)
    conn.close()
    return shutdown_s
