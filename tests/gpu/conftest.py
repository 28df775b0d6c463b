"""The GPU tier's processes set PyTorch's pinned-memory option as a job's process does, before anything touches the
GPU (building a test's model does): PyTorch reads it once, when CUDA initialises, and a job's first engine sleep is
timed under it (eps_screen.run.engines.pin_host_memory_in_threads)."""

from eps_screen.run import engines


def pytest_configure(config):
    engines.pin_host_memory_in_threads()
