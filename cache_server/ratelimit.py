"""A token-bucket rate limiter per caller, in one server process.

Each caller (a token, or a client address when it sent none) may make ``per_minute`` requests a
minute, in bursts of up to ``per_minute``. The buckets live in the process: with several server
workers or replicas a caller gets up to that many a minute from each. Limits that must hold across
processes are counted in the database instead (see :func:`cache_server.job_counts.count_created`).

Example:
    >>> now = [0.0]
    >>> limit = RateLimiter(per_minute=2, clock=lambda: now[0])
    >>> limit.wait("a"), limit.wait("a"), limit.wait("a"), limit.wait("b")
    (0.0, 0.0, 30.0, 0.0)
    >>> now[0] = 30.0
    >>> limit.wait("a")
    0.0
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from fastapi import HTTPException, status

MAX_CALLERS = 100_000  # buckets kept before the idle ones are dropped


class RateLimiter:
    def __init__(self, per_minute: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if per_minute < 1:
            raise ValueError(f"per_minute must be at least 1, not {per_minute}")
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0  # tokens a second
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # caller -> (tokens, at)
        self._lock = threading.Lock()

    def wait(self, caller: str) -> float:
        """Takes one request from ``caller``'s bucket: 0.0 if allowed, else the seconds until
        one would be (nothing is taken then)."""
        with self._lock:
            now = self._clock()
            tokens, at = self._buckets.get(caller, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - at) * self.rate)
            if tokens < 1.0:
                self._buckets[caller] = (tokens, now)
                return (1.0 - tokens) / self.rate
            self._buckets[caller] = (tokens - 1.0, now)
            if len(self._buckets) > MAX_CALLERS:
                self._drop_full(now)
            return 0.0

    def _drop_full(self, now: float) -> None:
        """Forgets callers whose buckets have refilled: they are as if never seen."""
        refill = self.capacity / self.rate
        self._buckets = {c: b for c, b in self._buckets.items() if now - b[1] < refill}


def too_many(detail: str, wait: float) -> HTTPException:
    """A 429 saying what was over the limit, with ``Retry-After`` (whole seconds, at least 1)."""
    retry = max(1, math.ceil(wait))
    headers = {"Retry-After": str(retry)}
    detail = f"{detail}; retry in {retry} s"
    return HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, detail, headers)
