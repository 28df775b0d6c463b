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
import os
import time
from collections.abc import Sequence

from eps_screen.generation import GenerationParams, Prompt


# What each backend's engine imports (vLLM's top level loads its engine lazily, at `from vllm import LLM`).
_ENGINE_MODULES = {"vllm": ("vllm.entrypoints.llm", "vllm.lora.request"), "transformers": ("transformers", "peft")}


def _serve(conn, backend: str, model_ref: str, config, quick_exit: bool) -> None:
    import importlib
    import traceback

    began = time.perf_counter()
    try:
        from eps_screen.generation.backends import make_generator, resolve_backend

        # Imported before the word to build, apart from the engine's build: a job starts this process early
        # (ProcessGenerator(build=False)), so its imports, most of what the child costs beyond its engine, overlap
        # the job's other work; the engine itself is built once the card is free for it.
        for module in _ENGINE_MODULES.get(resolve_backend(backend), ()):
            importlib.import_module(module)
        conn.send(("imported", time.perf_counter() - began))
        try:
            if conn.recv() is None:  # ended before it was built
                return
        except EOFError:
            return
        building = time.perf_counter()
        gen = make_generator(backend, model_ref, config)
    except BaseException:  # noqa: BLE001 - the parent raises it with this traceback
        conn.send(("error", traceback.format_exc()))
        return
    stats = {**getattr(gen, "stats", {}), "child_build_s": time.perf_counter() - building}
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
                if isinstance(request, str):  # "sleep" or "wake": the card handed to training and back
                    control = getattr(gen, request, None)
                    out = control() if callable(control) else None  # an engine that never sleeps (CPU): nothing
                else:
                    out = gen.generate_many(*request)
                conn.send(("ok", out, dict(getattr(gen, "stats", {}))))
            except BaseException:  # noqa: BLE001
                conn.send(("error", traceback.format_exc()))
    finally:
        if quick_exit and getattr(gen, "engine_in_process", False):
            # Every byte the engine holds is this process's: the exit gives it all back, so the engine's orderly
            # shutdown and the interpreter's teardown would only keep the card idle longer (the job waits on them).
            _send_quietly(conn, ("closed", 0.0))
            os._exit(0)
        closing = time.perf_counter()
        gen.close()
        _send_quietly(conn, ("closed", time.perf_counter() - closing))  # the engine's shutdown, apart from the exit


def _send_quietly(conn, message) -> None:
    try:
        conn.send(message)
    except (BrokenPipeError, OSError):
        pass


class ProcessGenerator:
    """The Generator interface over an engine in a child process (spawned: the parent has CUDA and threads).

    `build=False` starts the process and its imports now and the engine at `build()` (or the first request): a job
    spawns it before its other engine's work, and builds it once that engine sleeps. `quick_exit=False` shuts the
    engine down in order before the child exits (its shutdown timed), as engines in other processes always are."""

    def __init__(self, backend: str, model_ref: str, config, *, build: bool = True, quick_exit: bool = True):
        context = multiprocessing.get_context("spawn")
        self.model_ref = model_ref
        self.name = f"{backend} (own process)"
        self._conn, child = context.Pipe()
        self._spawned = time.perf_counter()
        # Not a daemon: the engine may start processes of its own. At this process's exit multiprocessing joins it,
        # while it waits on a pipe this process still holds: a job that failed before releasing the engine would
        # never exit (on a local GPU, holding the card; RunPod's worker ends the pod once the run is final). So a
        # finalizer that runs before that join (exitpriority), or when this object is dropped, ends the child;
        # close() is that finalizer.
        self.process = context.Process(target=_serve, args=(child, backend, model_ref, config, quick_exit),
                                       name=f"engine {model_ref}")
        self.process.start()
        child.close()
        self._end = multiprocessing.util.Finalize(self, _end_child, args=(self._conn, self.process), exitpriority=10)
        self.stats: dict = {}
        self.built = False
        self._imported = 0.0  # when the child said its imports were done (perf_counter), 0 before
        self._building: float | None = None
        if build:
            self.build()

    def ready_to_build(self, timeout: float = 0.0) -> bool:
        """Whether the child's imports are done (waiting up to timeout seconds); an error there is raised."""
        if not self._imported and self._conn.poll(timeout):
            self.stats["child_import_s"] = self._reply()
            self._imported = time.perf_counter()
        return bool(self._imported)

    def poll_built(self, timeout: float) -> bool:
        """Have the child build its engine, and say whether it is built, waiting up to timeout seconds for each of
        its imports and its build (an error in either is raised)."""
        self.start_build()
        if not self.built and self.ready_to_build(timeout) and self._conn.poll(timeout):
            self.finish_build()
        return self.built

    def build(self) -> None:
        """Build the engine; what the caller waits is process_start_s, of which imports_waited_s for the child's
        imports (0 when they were done before)."""
        self.start_build()
        self.finish_build()

    def start_build(self) -> None:
        """Have the child build its engine, without waiting for it (engines of a group build together)."""
        if self.built or self._building is not None:
            return
        self._building = time.perf_counter()
        try:
            self._conn.send("build")
        except (BrokenPipeError, OSError):  # the child ended at its imports: its error waits in the pipe
            pass

    def finish_build(self) -> None:
        if self.built:
            return
        self.start_build()
        started = self._building
        self.ready_to_build(timeout=None)
        waited = max(0.0, self._imported - started)
        self._reply()
        self.built = True
        self.stats.update(process_start_s=time.perf_counter() - started, imports_waited_s=waited,
                          spawned_before_build_s=started - self._spawned)

    def _reply(self):
        try:
            status, *rest = self._conn.recv()
        except EOFError:
            self.process.join(5)
            raise RuntimeError(f"the engine process of {self.model_ref} ended (exit code {self.process.exitcode})") \
                from None
        if status == "error":
            raise RuntimeError(f"the engine process of {self.model_ref} failed:\n{rest[0]}")
        if status == "imported":
            return rest[0]
        out, stats = rest
        self.stats.update(stats)
        return out

    def generate(self, prompts: Sequence[Prompt], params: GenerationParams, adapter: str | None = None):
        return self.generate_many([(prompts, adapter)], params)[0]

    def generate_multi(self, prompts: Sequence[Prompt], params: GenerationParams, adapters: Sequence[str | None]):
        return self.generate_many([(prompts, a) for a in adapters], params)

    def generate_many(self, jobs, params):
        self.submit(jobs, params)
        return self.collect()

    def submit(self, jobs, params) -> None:
        """Send a generate_many call without waiting for its answers (collect() returns them)."""
        self.build()
        self._conn.send(([(list(prompts), adapter) for prompts, adapter in jobs], params))

    def collect(self):
        return self._reply()

    def post(self, what: str) -> bool:
        """Send "sleep" or "wake" to a built engine without waiting (collect() waits); False: none is built."""
        if self.built:
            self._conn.send(what)
        return self.built

    def release(self) -> None:
        """End the engine's process: all its memory given back."""
        started = time.perf_counter()
        shutdown_s = self._end()
        self.stats["release_s"] = time.perf_counter() - started
        if shutdown_s is not None:
            self.stats["child_shutdown_s"] = shutdown_s

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
