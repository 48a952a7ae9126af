"""Load shedding: a server process works on a bounded number of requests; beyond what it can
answer in time, it says so at once (503 with ``Retry-After``) instead of letting every request
wait.

:class:`LoadShedding` (pure ASGI middleware) admits up to ``max_in_flight`` requests at a time.
One more waits for a free slot only when the slots should free up within ``max_wait`` seconds:
its expected wait is the time the requests ahead of it take (moving averages of how long admitted
requests took and of its spread: their mean plus two standard deviations of their sum), divided
by the slots. A request that would wait longer, or that waited ``max_wait`` without a slot, gets
503 with ``Retry-After`` before its body is read. The margin keeps the second kind rare, so a
refusal comes at once: with the mean alone, more than one 503 in a hundred came only after
waiting ``max_wait`` (bench/server_load.py ``--overload`` at twice the sustainable rate: 503 p99
23 ms, against 4–8 ms with the margin). Without shedding a burst above capacity queues in the
event loop and every request waits seconds (measured: 400 lookups/s against a 200/s server,
p50 21.8 s, p99 40 s).

``/health`` and ``/metrics`` have slots of their own (:data:`MONITOR_SLOTS`, no waiting): an
overloaded server still says how it is, and a flood of them (each counts the records) cannot take
the database connections the API needs. So do snapshots (``/v1/snapshot``, :data:`BULK_SLOTS`):
an export's cost grows with the winners of an arch (20,000 took 22 s), and two anonymous ones
held both slots of a process, every lookup refused meanwhile (and their times would have made
the moving average shed what followed). A lookup never waits behind one. So do the dashboard's pages
(:func:`browsing`), whose cost grows with what uploaders stored (two anonymous views of the index
over records of 1.75 MB each took 10 to 15 s and every lookup of the process was refused
meanwhile).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

MONITORING = frozenset({"/health", "/metrics"})
MONITOR_SLOTS = 2
BULK = frozenset({"/v1/snapshot"})
BULK_SLOTS = 1
BROWSE_SLOTS = 2
SMOOTHING = 0.1  # weight of the newest request in the moving average of request times


def route_path(scope: dict[str, Any]) -> str:
    """The path the app routes ``scope`` by: behind a prefix (``--root-path``), uvicorn's path
    holds it too."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    return path[len(root) :] or "/" if root and path.startswith(root) else path


def browsing(scope: dict[str, Any]) -> bool:
    """Whether ``scope`` is a dashboard page (not its static files: cheap, and a page loads
    several at once). Record listings stay in the API's slots: daemons, warm starts and
    ``tunecache get`` read them, and the listing's cost is bounded (a record's worst check)."""
    path = route_path(scope)
    if scope.get("method") not in ("GET", "HEAD"):
        return False
    return path == "/" or (path.startswith("/ui/")
                           and not path.startswith(("/ui/static/", "/ui/swagger/")))  # fmt: skip


@dataclass
class _Side:
    takes: Callable[[dict[str, Any]], bool]
    slots: int
    what: str
    busy: int = 0


def _on(paths: frozenset[str]) -> Callable[[dict[str, Any]], bool]:
    return lambda scope: route_path(scope) in paths


class LoadShedding:
    """Answers 503 to what this process cannot start within ``max_wait`` (see the module doc).

    Args:
        app: the ASGI app.
        max_in_flight: requests worked on at once.
        max_wait: seconds a request may wait for a slot.
        retry_after: seconds a shed request is told to wait (``Retry-After``).
        reject: sends an error answer ``(send, status, detail, headers)``.
    """

    def __init__(self, app: Any, *, max_in_flight: int, max_wait: float, retry_after: int,
                 reject: Callable[..., Awaitable[None]]) -> None:  # fmt: skip
        self.app, self.reject = app, reject
        self.max_in_flight, self.max_wait, self.retry_after = max_in_flight, max_wait, retry_after
        self.in_flight = 0
        # requests in flight on slots of their own: (paths, slots, what they are, how many)
        self.sides = [_Side(_on(MONITORING), MONITOR_SLOTS, "health or metrics"),
                      _Side(_on(BULK), BULK_SLOTS, "snapshot"),
                      _Side(browsing, BROWSE_SLOTS, "dashboard page")]  # fmt: skip
        self.waiting: deque[asyncio.Future[None]] = deque()
        self.seconds_per_request = 0.005  # until measured
        self.square_per_request = self.seconds_per_request**2  # their squares' moving average

    def expected_wait(self) -> float:
        """Seconds one more request would wait for a slot, from the recent times per request:
        the ``k`` requests ahead of it take ``k`` mean times, plus two standard deviations of
        their sum (``√k`` of one), so that one admitted to wait seldom waits in vain."""
        if self.in_flight < self.max_in_flight:
            return 0.0
        ahead = len(self.waiting) + 1
        spread = math.sqrt(max(self.square_per_request - self.seconds_per_request**2, 0.0))
        took = ahead * self.seconds_per_request + 2 * math.sqrt(ahead) * spread
        return took / self.max_in_flight

    async def _admit(self) -> bool:
        """Takes a slot, waiting at most ``max_wait``; whether it got one."""
        if self.in_flight < self.max_in_flight:
            self.in_flight += 1
            return True
        if self.expected_wait() > self.max_wait:
            return False
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append(slot)
        try:
            await asyncio.wait_for(asyncio.shield(slot), self.max_wait)
        except TimeoutError:
            if slot.done():  # handed over just as the wait ran out: take it
                return True
            self.waiting.remove(slot)
            return False
        except asyncio.CancelledError:  # the client went away while waiting
            if slot.done():
                self._release()  # the slot handed over: pass it on
            else:
                self.waiting.remove(slot)
            raise
        return True

    async def _aside(self, side: _Side, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """A request of ``side``'s paths, in its slots (no waiting)."""
        if side.busy >= side.slots:
            detail = f"{side.busy} {side.what} requests are in progress"
            await self.reject(send, 503, detail, {"Retry-After": str(self.retry_after)})
            return
        side.busy += 1
        try:
            await self.app(scope, receive, send)
        finally:
            side.busy -= 1

    def _release(self) -> None:
        """Hands the slot to the first request still waiting, else frees it."""
        while self.waiting:
            slot = self.waiting.popleft()
            if not slot.done():
                slot.set_result(None)
                return
        self.in_flight -= 1

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        side = next((side for side in self.sides if side.takes(scope)), None)
        if side is not None:
            await self._aside(side, scope, receive, send)
            return
        if not await self._admit():
            detail = (f"the server is busy ({self.in_flight} requests in progress, "
                      f"{len(self.waiting)} waiting); retry in {self.retry_after} s")  # fmt: skip
            await self.reject(send, 503, detail, {"Retry-After": str(self.retry_after)})
            return
        started = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            took = time.perf_counter() - started
            self.seconds_per_request += SMOOTHING * (took - self.seconds_per_request)
            self.square_per_request += SMOOTHING * (took * took - self.square_per_request)
            self._release()
