"""Several engines of one model on one GPU, each in a process of its own, as one generator (eval.vllm_engines).

A small model's vLLM engine is bound by its process's Python, not by the card: SmolLM2-135M's evaluation ran at
16,000-19,000 tokens/s on an H100 with the card mostly idle (BENCHMARKS.md), its scheduling, sampling and
detokenization on one core. Engines in separate processes run those on separate cores, the card shared.

A call's jobs (a job: one cell's or answer set's prompts, with its adapter and generation params) are dealt out
whole, the largest first, each to the engine with the fewest requests so far; every engine gets its share at once
and the answers come back in the call's order. A job's answers do not depend on its engine when each answer has a
seed of its own (eval.vllm_seed_each_answer).

Memory: engines that start together would each measure the others' allocations as their own (vLLM profiles the
memory of the whole card), so each gets a fixed KV cache (eval.vllm_kv_cache_gib, else 60% of its share) and a
share of what is free now, less the margin one engine needs beside it. On a cold compile cache one engine builds
first, alone, until its compiled model is saved: the others then start from it, not racing to write it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from eps_screen.generation import params_per_job
from eps_screen.generation.engine_process import ProcessGenerator

KV_SHARE = 0.6  # of an engine's share of the card; the rest: weights, activations, CUDA graphs, the sampler's buffers


def member_config(config, engines: int, free_bytes: int, total_bytes: int, margin_gib: float):
    """The config each of `engines` engines builds from: its share of the card, a KV cache of fixed size."""
    budget = (free_bytes - margin_gib * 2**30) / engines
    if budget < 2 * 2**30:
        raise RuntimeError(f"{free_bytes / 2**30:.1f} GiB free on the GPU leaves {budget / 2**30:.1f} GiB for each of"
                           f" eval.vllm_engines={engines} engines: fewer engines (eval.vllm_engines)")
    ev = config.eval
    update = {"vllm_engines": 1, "vllm_gpu_memory_utilization": round(budget / total_bytes, 4),
              "vllm_kv_cache_gib": ev.vllm_kv_cache_gib or round(KV_SHARE * budget / 2**30, 2)}
    return config.model_copy(update={"eval": ev.model_copy(update=update)})


def vllm_cache_root() -> Path:
    """Where vLLM keeps what it compiles and looks up (engine_cache_dir's, where set, else vLLM's default)."""
    return Path(os.environ.get("VLLM_CACHE_ROOT") or Path.home() / ".cache" / "vllm")


def compile_cache_warm() -> bool:
    """Whether vLLM's compile cache holds an earlier build."""
    root = vllm_cache_root() / "torch_compile_cache"
    return root.is_dir() and any(root.iterdir())


def compiled_models() -> set[Path]:
    """The compiled models vLLM has saved under its cache root. vLLM 0.26 on torch 2.10 or later saves each one
    whole (written aside, then renamed) once its compile is done, before the engine profiles its memory and
    captures its CUDA graphs: torch_compile_cache/torch_aot_compile/HASH/rank_R/model."""
    return set((vllm_cache_root() / "torch_compile_cache" / "torch_aot_compile").glob("*/rank_*/model"))


def deal(sizes: list[int], engines: int) -> list[list[int]]:
    """Job indices per engine: whole jobs, the largest first, each to the least loaded engine."""
    loads, shares = [0] * engines, [[] for _ in range(engines)]
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        k = loads.index(min(loads))
        shares[k].append(i)
        loads[k] += sizes[i]
    return [sorted(s) for s in shares]


class EngineGroup:
    """The Generator interface over `engines` ProcessGenerators of one model."""

    def __init__(self, backend: str, model_ref: str, member, engines: int, *, build_one_first: bool = False):
        self.name = f"{backend} x{engines} (own processes)"
        self.model_ref = model_ref
        self.members = [ProcessGenerator(backend, model_ref, member, build=False) for _ in range(engines)]
        self.first_alone: dict = {}  # how long the first member built alone, and what ended its wait
        try:
            if build_one_first:
                self._first_compiles()
            for m in self.members:
                m.start_build()
            for m in self.members:
                m.finish_build()
        except BaseException:
            self.close()
            raise

    def _first_compiles(self, poll_s: float = 0.5) -> None:
        """The first member builds alone until it has saved its compiled model, or is built: the others then load
        what it compiled, not compile it again beside it, and they start while it captures its CUDA graphs. In H100
        run 6 the first engine saved its compile 65 s before it was ready (BENCHMARKS.md, "The job host"). Where
        vLLM saves no compiled model (its AOT compile off), they wait for the first to be built."""
        began, before = time.perf_counter(), compiled_models()
        first, until = self.members[0], "first_built"
        while not first.poll_built(poll_s):
            if compiled_models() - before:
                until = "compile_saved"
                break
        self.first_alone = {"first_alone_s": time.perf_counter() - began, "others_started_on": until}

    @property
    def stats(self) -> dict:
        """The members' figures: counts summed, times as the slowest member's (the group waits for it)."""
        each = [m.stats for m in self.members]
        out: dict = {"engines": len(each)}
        for key in ("generated_tokens", "requests"):
            out[key] = sum(s.get(key, 0) for s in each)
        for key in ("start_s", "process_start_s", "child_build_s"):
            out[key] = max((s.get(key, 0.0) for s in each), default=0.0)
        for key in ("sleep_s", "wake_s"):
            runs = [s.get(key, []) for s in each]
            out[key] = [max(r) for r in zip(*runs, strict=False)]
        out["gpu_memory_share"] = each[0].get("gpu_memory_share") if each else None
        return {**out, **self.first_alone}

    def generate(self, prompts, params, adapter=None):
        return self.generate_many([(prompts, adapter)], params)[0]

    def generate_multi(self, prompts, params, adapters):
        return self.generate_many([(prompts, a) for a in adapters], params)

    def generate_many(self, jobs, params):
        per_job = params_per_job(jobs, params)
        shares = deal([len(prompts) * p.samples for (prompts, _), p in zip(jobs, per_job, strict=True)],
                      len(self.members))
        busy = [(m, share) for m, share in zip(self.members, shares, strict=True) if share]
        for m, share in busy:
            m.submit([jobs[i] for i in share], [per_job[i] for i in share])
        out: list = [None] * len(jobs)
        errors = []
        for m, share in busy:  # every member's reply is read, so no pipe is left holding one after an error
            try:
                out_share = m.collect()
            except RuntimeError as exc:
                errors.append(exc)
                continue
            for i, answers in zip(share, out_share, strict=True):
                out[i] = answers
        if errors:
            raise errors[0]
        return out

    def sleep(self) -> None:
        self._control("sleep")

    def wake(self) -> None:
        self._control("wake")

    def _control(self, what: str) -> None:
        for m in [m for m in self.members if m.post(what)]:
            m.collect()

    def close(self) -> None:
        for m in self.members:
            m.close()
