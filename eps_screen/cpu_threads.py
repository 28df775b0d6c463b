"""How many threads torch uses on a CPU: models and the tiny model's build both set it before heavy work."""

from __future__ import annotations


def limit_cpu_threads() -> None:
    """One intra-op thread on CPU unless EPS_SCREEN_TORCH_THREADS says otherwise.

    The tiny model's matrices are too small to gain from threads, and OpenMP threads spin-wait: on a busy
    2-core machine, two threads made generation 9x slower than one (1.4 s vs 13 s for 72 answers).
    """
    import os

    import torch

    if not torch.cuda.is_available():
        torch.set_num_threads(int(os.environ.get("EPS_SCREEN_TORCH_THREADS", "1")))
