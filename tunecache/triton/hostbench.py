"""A benchmark for Triton's interpreter, which has no device timer.

Under ``TRITON_INTERPRET=1`` Triton's own ``do_bench`` needs a GPU driver and fails ("0 active
drivers"), so an ``@triton.autotune`` kernel cannot be tuned at all. :func:`host_bench` times a
call on the host clock instead: the configs it ranks are ranked by the interpreter's speed, which
says nothing of a GPU's, and the records they make are keyed to this CPU (as every interpreted
call is), never served to a GPU. It makes the whole flow (tune, validate, upload, hit) run on a
machine without a GPU.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from tunecache.measured import INTERPRETER_TIMER

REPEATS = 3  # timed calls after one warm-up call
TIMER = INTERPRETER_TIMER

calls = 0  # host benchmarks run in this process


def host_bench(kernel_call: Callable[[], Any],
               quantiles: Sequence[float] | None = None) -> float | list[float]:  # fmt: skip
    """``do_bench``'s answer for ``kernel_call`` timed on the host clock (ms): the median, or one
    time per quantile of :data:`REPEATS` calls after a warm-up call."""
    global calls
    calls += 1
    kernel_call()
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        kernel_call()
        times.append((time.perf_counter() - started) * 1e3)
    if quantiles is None:
        return statistics.median(times)
    ordered = sorted(times)
    return [ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] for q in quantiles]
