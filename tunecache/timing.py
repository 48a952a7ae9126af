"""Timers: warm-up, then the median of many samples.

* CPU: ``perf_counter``; calls shorter than ``min_sample_s`` are batched (``number`` calls per
  sample, as ``timeit`` does) so the timer's own resolution and overhead stay out of the figure.
* CUDA: a pair of CUDA events around every call, the L2 cache flushed before each by zeroing a
  256 MB buffer (as Triton's ``do_bench`` does), one synchronisation at the end.

With ``cutoff_ms`` set (the tuner sets it to 3× the best time so far), a call already slower
than that after the warm-up is not timed at length: its first estimate is its time.

Pure functions: no search here. torch is imported only by the CUDA timer.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tunecache.schemas import TimingModel


@dataclass(frozen=True)
class TimerSettings:
    """How long and how often to time one callable."""

    warmup: int = 3
    min_repeats: int = 15
    max_repeats: int = 200
    min_sample_s: float = 1e-3  # one sample lasts at least this long (batching fast calls)
    target_s: float = 0.3  # stop adding repeats once this much time was spent
    cutoff_ms: float | None = None  # a call slower than this is cut short (see the module)


DEFAULT_TIMER = TimerSettings()


def time_cpu(fn: Callable[[], Any], settings: TimerSettings = DEFAULT_TIMER) -> TimingModel:
    """Times ``fn()``: median per-call milliseconds with min, max and inter-quartile range."""
    for _ in range(settings.warmup):
        fn()
    start = time.perf_counter()
    fn()
    single = max(time.perf_counter() - start, 1e-9)
    if settings.cutoff_ms is not None and single * 1e3 > settings.cutoff_ms:
        return _stats([single * 1e3], settings, 1, f"perf_counter, cut short: over "
                      f"{settings.cutoff_ms:.4g} ms")  # fmt: skip
    number = max(1, int(settings.min_sample_s / single))
    samples: list[float] = []
    spent = 0.0
    while len(samples) < settings.max_repeats and (
        len(samples) < settings.min_repeats or spent < settings.target_s
    ):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - start
        spent += elapsed
        samples.append(elapsed / number * 1e3)
    return _stats(
        samples, settings, number, f"perf_counter median of {len(samples)} samples x {number} calls"
    )


L2_FLUSH_BYTES = 256 * 2**20


def _stats(samples: list[float], settings: TimerSettings, number: int, timer: str) -> TimingModel:
    quartiles = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    return TimingModel(
        median_ms=statistics.median(samples),
        min_ms=min(samples),
        max_ms=max(samples),
        iqr_ms=max(0.0, quartiles[2] - quartiles[0]),
        repeats=len(samples) * number,
        warmup=settings.warmup,
        timer=timer,
    )


def time_cuda(fn: Callable[[], Any], settings: TimerSettings = DEFAULT_TIMER) -> TimingModel:
    """Times ``fn()`` on the current CUDA device with events, flushing L2 before every call."""
    import torch

    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    for _ in range(settings.warmup):
        fn()
    torch.cuda.synchronize()
    # Estimate one call (with its flush) to size the run to ``target_s``.
    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    first.record()
    for _ in range(5):
        flush.zero_()
        fn()
    last.record()
    torch.cuda.synchronize()
    estimate_s = max(first.elapsed_time(last) / 5 / 1e3, 1e-7)
    if settings.cutoff_ms is not None and estimate_s * 1e3 > settings.cutoff_ms:
        # the flush is inside the estimate: an upper bound, fine for a candidate this slow
        return _stats([estimate_s * 1e3], settings, 5, f"cuda events, cut short: over "
                      f"{settings.cutoff_ms:.4g} ms")  # fmt: skip
    count = int(
        min(settings.max_repeats, max(settings.min_repeats, settings.target_s / estimate_s))
    )
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    for start, end in zip(starts, ends, strict=True):
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    return _stats(samples, settings, 1, f"cuda events, L2 flushed, median of {count}")


def speedup_text(
    speedup: float, times: str = "x", interval: tuple[float, float] | None = None, than: str = ""
) -> str:
    """``2.00x faster``, ``1.89x slower`` or ``1.00x (the same)``: never a bare ``0.53x``.
    With the interval of an interleaved comparison, the interval too, and ``the same within
    noise`` when it holds 1.

    Args:
        speedup: baseline time / tuned time.
        times: the multiplication sign (``x`` on a terminal, ``×`` in HTML).
        interval: ``(low, high)`` of ``speedup`` (:class:`tunecache.schemas.Speedup`).
        than: the baseline's name, to say what it is faster or slower than.

    Example:
        >>> speedup_text(2.0), speedup_text(0.5, interval=(0.45, 0.55))
        ('2.00x faster', '2.00x slower (1.82-2.22x)')
        >>> speedup_text(1.02, interval=(0.97, 1.08), than="torch eager")
        'the same as torch eager within noise (0.97-1.08x)'
    """
    than_it = f" than {than}" if than else ""
    if interval is not None:
        low, high = interval
        if low <= 1.0 <= high:
            same = f"the same as {than}" if than else "the same"
            return f"{same} within noise ({low:.2f}-{high:.2f}{times})"
        if speedup >= 1:
            return f"{speedup:.2f}{times} faster{than_it} ({low:.2f}-{high:.2f}{times})"
        return f"{1 / speedup:.2f}{times} slower{than_it} ({1 / high:.2f}-{1 / low:.2f}{times})"
    if 0.995 <= speedup < 1.005:
        return f"1.00{times} (the same as {than})" if than else f"1.00{times} (the same)"
    if speedup >= 1:
        return f"{speedup:.2f}{times} faster{than_it}"
    return f"{1 / speedup:.2f}{times} slower{than_it}"


def best_so_far(times: Sequence[float | None]) -> list[float | None]:
    """The fastest time among the trials up to each one (``None`` until one has run; a failed
    trial is ``None``)."""
    found: list[float | None] = []
    best: float | None = None
    for time_ms in times:
        if time_ms is not None and (best is None or time_ms < best):
            best = time_ms
        found.append(best)
    return found
