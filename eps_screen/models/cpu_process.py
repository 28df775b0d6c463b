"""How a process that runs models on the CPU is set up: models and the tiny model's build both call it first."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's ceiling on 64-bit: larger values are refused


def prepare_cpu_process() -> None:
    """One intra-op thread unless EPS_SCREEN_TORCH_THREADS says otherwise, and freed memory kept for reuse.

    Threads: the tiny model's matrices are too small to gain from threads, and OpenMP threads spin-wait: on a busy
    2-core machine, two threads made generation 9x slower than one (1.4 s vs 13 s for 72 answers).

    Memory: glibc hands every block over its (adaptive) mmap threshold back to the kernel when it is freed, so each
    training step's activations and logits were fresh pages again: 194 million page faults and 309 s of system time
    in one tiny screen. Serving blocks up to 32 MiB from the heap and not trimming it cut a cell's page faults 15x
    and its CPU time by about a quarter (BENCHMARKS.md, "The first screen in five minutes"). Not on a GPU, where
    the heap is not where the big tensors live.
    """
    import torch

    if torch.cuda.is_available():
        return
    torch.set_num_threads(int(os.environ.get("EPS_SCREEN_TORCH_THREADS", "1")))
    _keep_freed_memory()


def _keep_freed_memory() -> None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS): its allocator's defaults stand
        return
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)
    mallopt(_M_TRIM_THRESHOLD, 2**30)
    mallopt(_M_TOP_PAD, 64 * 2**20)
