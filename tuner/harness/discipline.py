"""Timing discipline for a measurement worker: the cores it runs on and its thread counts.

``TUNECACHE_TIMING_CORES`` reserves cores for timing (a fleet machine's compiles and other jobs
stay off them): a measurement worker then starts pinned to them, with exactly as many threads in
every runtime that keeps a pool (OpenMP, MKL, TVM, torch), set before any is loaded. Unset, the
workers keep the runtimes' own thread counts — those a consumer's process will run the kernel
with — and run where the operating system puts them: forcing one thread per core timed a
parallel TVM layernorm at 6.6 ms beside two busy processes on this 2-core machine (its pool
threads wait on each other through whole scheduler slices), against 0.083 ms with the runtime's
default; and a config tuned with threads its consumers do not use is tuned for another machine.
Warm-ups, leaving out disturbed samples and the GPU's L2 flush are the timers' own
(:mod:`tunecache.timing`).
"""

from __future__ import annotations

import os

from tunecache.errors import InvalidInput
from tunecache.settings import omp_threads, thread_counts, timing_cores


def reserved_cores() -> list[int] | None:
    """The cores ``TUNECACHE_TIMING_CORES`` reserves for measurement workers (those this
    process may use among them), or ``None`` when unset.

    Raises:
        InvalidInput: ``TUNECACHE_TIMING_CORES`` is malformed or names no core this process may
            use.
    """
    wanted = timing_cores()
    if wanted is None:
        return None
    try:
        mine = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        mine = set(range(os.cpu_count() or 1))
    cores = [c for c in wanted if c in mine]
    if not cores:
        raise InvalidInput(f"TUNECACHE_TIMING_CORES names cores {wanted}, none of which this "
                           f"process may use ({sorted(mine)})")  # fmt: skip
    return cores


def worker_environment(cores: list[int] | None) -> dict[str, str | None]:
    """The thread counts of a worker pinned to ``cores`` (none when not pinned; the user's own
    settings stand)."""
    return thread_counts(len(cores)) if cores else {}


def settle(cores: list[int]) -> None:
    """Pins this process to ``cores`` and sets torch's thread count to match: a pinned
    measurement worker's first steps, after :func:`worker_environment` was applied."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    import torch

    torch.set_num_threads(omp_threads() or len(cores))
