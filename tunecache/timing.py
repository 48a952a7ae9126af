"""CPU timing: warm-up, then the median of many samples on ``perf_counter``.

Calls shorter than ``min_sample_s`` are batched (``number`` calls per sample, as ``timeit`` does) so
the timer's own resolution and overhead stay out of the figure. Pure functions: no search here.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
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


DEFAULT_TIMER = TimerSettings()


def time_cpu(fn: Callable[[], Any], settings: TimerSettings = DEFAULT_TIMER) -> TimingModel:
    """Times ``fn()``: median per-call milliseconds with min, max and inter-quartile range."""
    for _ in range(settings.warmup):
        fn()
    start = time.perf_counter()
    fn()
    single = max(time.perf_counter() - start, 1e-9)
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
    quartiles = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    return TimingModel(
        median_ms=statistics.median(samples),
        min_ms=min(samples),
        max_ms=max(samples),
        iqr_ms=max(0.0, quartiles[2] - quartiles[0]),
        repeats=len(samples) * number,
        warmup=settings.warmup,
        timer=f"perf_counter median of {len(samples)} samples x {number} calls",
    )
