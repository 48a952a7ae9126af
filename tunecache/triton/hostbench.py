"""A benchmark for Triton's interpreter, which has no device timer.

Under ``TRITON_INTERPRET=1`` Triton's own ``do_bench`` needs a GPU driver and fails ("0 active
drivers"), so an ``@triton.autotune`` kernel cannot be tuned at all. :func:`host_bench` times a
call on the host clock instead: the configs it ranks are ranked by the interpreter's speed, which
says nothing of a GPU's, and the records they make are keyed to this CPU (as every interpreted
call is), never served to a GPU. It makes the whole flow (tune, validate, upload, hit) run on a
machine without a GPU. :func:`cannot_run` tells the interpreter's failed ``tl.static_assert``,
which a GPU compile reports as a config that cannot run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from tunecache.measured import INTERPRETER_TIMER
from tunecache.settings import interpret_enabled

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


def interpreted() -> bool:
    """Whether Triton's interpreter runs the kernels (``TRITON_INTERPRET``)."""
    try:
        return interpret_enabled()
    except ValueError:
        return False  # Triton refuses the value itself


def cannot_run(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a ``tl.static_assert`` failing under the
    interpreter: an ``AssertionError`` raised by the interpreter's own ``static_assert``. A GPU
    compile raises ``CompileTimeAssertionFailure`` there, which Triton's autotuner times as
    never faster ("cannot run"); the interpreter raises it at run time, wrapped."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, AssertionError) and _raised_by(cause, "_new_static_assert"):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _raised_by(exc: BaseException, function: str) -> bool:
    """Whether the innermost frame of ``exc``'s traceback is Triton's interpreter's
    ``function``."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    code = tb.tb_frame.f_code
    return code.co_name == function and code.co_filename.endswith("interpreter.py")
