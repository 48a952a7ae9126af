"""A fast MetaSchedule builder: a small build function in a pool of warm worker processes.

Three costs of MetaSchedule's ``LocalBuilder`` and ``LocalRunner`` dominate a small CPU tune:

* its default build function imports ``tvm.s_tir.tensor_intrin`` (~20 s) in every fresh worker;
  llvm candidates need none of it, so :func:`fast_build` only strips the layout-rewrite blocks and
  calls ``tvm.tirx.build``;
* it starts a new process pool for every batch (and one more for a sanity check), and each
  worker spends ~2.5 s importing TVM. :class:`WarmPool` keeps one pool for the whole search,
  starts its workers at once (while the search space is being generated) and recycles each
  worker after :data:`MAX_USES` tasks, which bounds the leak ``LocalBuilder`` restarts for;
* ``LocalRunner`` blocks until its own worker has imported TVM: here the runner
  (:mod:`backends.tvm.runner`) measures in the same warm pool, one candidate at a time, after the
  batch is built, so a search starts ``cores`` TVM processes instead of ``2 + cores`` per batch.

Workers receive :func:`fast_build` through cloudpickle *by value* (see the registration at the
bottom), so they need not be able to import this repository.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from tvm.ir import IRModule
    from tvm.runtime import Module
    from tvm.target import Target

logger = logging.getLogger(__name__)

MAX_USES = 64  # builds per worker process before it is replaced
# The error of a candidate neither built nor run because the search's time budget ran out; the
# search drops such candidates from its trials (they were never measured).
SKIPPED = "skipped: the search's time budget is spent"


def fast_build(mod: IRModule, target: Target, _params: dict[str, Any] | None) -> Module:
    """Compiles one candidate for ``target`` (the ``LocalBuilder`` ``f_build`` signature)."""
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.tirx.build(mod, target=target)


def fast_export(mod: Module) -> str:
    """Links ``mod`` into a shared library in a fresh directory; returns its path.

    A shared library, not MetaSchedule's default tar of object files: the tar is linked when
    the runner loads it (~40 ms a candidate, serially), the library here in parallel workers.
    """
    import os
    import tempfile

    path = os.path.join(tempfile.mkdtemp(prefix="tunecache-tvm-"), "candidate.so")
    mod.export_library(path)
    return path


def _ready() -> float:
    """Runs in a worker once it has imported TVM: the warm-up task; when (``time.monotonic()``,
    one clock for every process of the machine)."""
    import time

    return time.monotonic()


def _ignore_interrupts() -> None:
    """A worker's initializer: Ctrl-C reaches the whole process group, and the search that owns
    the worker decides what an interrupt stops (a worker dying of it printed a traceback)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


MAX_LOG_BYTES = 2**20


def _log_mode(log: Path) -> str:
    """Appended to, until it passes :data:`MAX_LOG_BYTES`: then started again."""
    try:
        return "wb" if log.stat().st_size > MAX_LOG_BYTES else "ab"
    except OSError:
        return "ab"


class WarmPool:
    """A process pool that outlives batches; its workers start importing TVM on creation."""

    def __init__(self, max_workers: int, timeout_sec: float, log: Path | None = None) -> None:
        """``log``: where the workers' own output goes (appended: searches may run side by side;
        by default this process's): a worker that Ctrl-C reached while it imported TVM printed
        a traceback."""
        from tvm.support.popen_pool import PopenPoolExecutor

        self._log = None if log is None else open(log, _log_mode(log))  # noqa: SIM115 — closed in close()
        self.timeout_sec = timeout_sec
        self.workers = max_workers
        self.deadline: float | None = None  # time.monotonic() after which nothing more starts
        # what must still fit before the deadline after the search, from one candidate's build
        # and measurement seconds (SearchRequest.after)
        self.after: Callable[[float, float], float] | None = None
        self.measured = 0  # candidates timed: the budget never stops the search before one
        self.built = 0  # candidates built: nor its builds before one
        self.build_s: list[float] = []  # the wall seconds of each round of parallel builds
        self.measure_s: list[float] = []  # the wall seconds of each candidate's timing
        # MetaSchedule's proposing of its latest round (cost model, evolution: seconds a round on
        # a CPU), from the end of the round before, or the pool's start, to its first build
        self.propose_s = 0.0
        self.workers_follow = True  # the tune's measurement workers start after the search
        self._idle_since: float | None = time.monotonic()  # None: a round is being built or run
        self.stopped = False  # interrupted: nothing more starts, whatever was measured
        self.pool = PopenPoolExecutor(
            max_workers=max_workers,
            timeout=timeout_sec,
            maximum_process_uses=MAX_USES,
            initializer=_ignore_interrupts,
            stdout=self._log,
            stderr=self._log,
        )
        # One warm-up task per worker thread: each starts its process now, in the background.
        self._created = time.monotonic()
        self._warmup = [self.pool.submit(_ready) for _ in range(max_workers)]

    def build(self, build_inputs: list[Any]) -> list[Any]:
        """Builds and exports every input; failures become ``BuilderResult`` errors."""
        from tvm.s_tir.meta_schedule.builder import BuilderResult
        from tvm.s_tir.meta_schedule.builder.local_builder import _worker_func
        from tvm.support.popen_pool import StatusKind

        if self._idle_since is not None:  # the round's first builds: its proposing is done
            self.propose_s, self._idle_since = time.monotonic() - self._idle_since, None
        args = [(fast_build, fast_export, b.mod, b.target, None) for b in build_inputs]
        results: list[Any] = []
        # Within a deadline, a round of parallel builds at a time (between rounds the time is
        # looked at: a batch of 16 builds took 10.6 s of a 10 s budget); without one, all at once.
        step = max(1, len(args) if self.deadline is None else self.workers)
        for start in range(0, len(args), step):
            if self.out_of_time(building=True):  # the rest of the batch is skipped
                return results + [BuilderResult(None, SKIPPED) for _ in args[len(results) :]]
            began = time.monotonic()
            chunk = args[start : start + step]
            for outcome in self.pool.map_with_error_catching(lambda a: _worker_func(*a), chunk):
                if outcome.status == StatusKind.COMPLETE:
                    results.append(BuilderResult(outcome.value, None))
                    self.built += 1
                elif outcome.status == StatusKind.TIMEOUT:
                    message = f"build timed out after {self.timeout_sec:g} s"
                    results.append(BuilderResult(None, message))
                else:
                    results.append(BuilderResult(None, f"build failed: {outcome.value}"))
            self.build_s.append(time.monotonic() - began)
        return results

    def start_s(self) -> float:
        """How long the workers took to start and import TVM (0 until they all have): the
        tune's measurement workers, started after the search, take about as long again."""
        if not all(f.done() and f.exception() is None for f in self._warmup):
            return 0.0
        return max(0.0, max(f.result() for f in self._warmup) - self._created)

    def round_done(self) -> None:
        """Says a round was built and measured: from now MetaSchedule updates its cost model
        and proposes the next (it runs every round, an empty one too)."""
        self._idle_since = time.monotonic()

    def out_of_time(self, *, building: bool = False, next_round: bool = False) -> bool:
        """Whether the search was stopped, or its deadline has passed (never without one, nor
        before one candidate ran, or, ``building``, was built): the deadline less what
        :attr:`after` needs, at the builds and timings seen so far, and the start of the
        measurement workers that follow (:meth:`start_s`); with ``next_round``, less
        what a round that measures anything costs too (proposing it as the latest round took,
        a round of parallel builds, their timings)."""
        if self.stopped:
            return True
        if self.deadline is None or (self.built if building else self.measured) == 0:
            return False
        left = self.deadline - time.monotonic()
        if self.after is None or not self.build_s:
            return left <= 0
        build = sum(self.build_s) / len(self.build_s)
        measure = sum(self.measure_s) / len(self.measure_s) if self.measure_s else 0.0
        after = self.after(build, measure) + (self.start_s() if self.workers_follow else 0.0)
        if not next_round:
            return left <= after
        ahead = self.propose_s + build + self.workers * measure
        logger.debug("MetaSchedule round done, %.2f s left: the next round %.2f s (proposing "
                     "it %.2f s), after the search %.2f s", left, ahead, self.propose_s,
                     after)  # fmt: skip
        return left <= after + ahead

    def close(self) -> None:
        """Stops the worker processes."""
        # TVM's PopenWorker.kill races its own threads when a search stops mid-batch
        # ('NoneType' object has no attribute 'kill'): the workers are gone either way.
        with contextlib.suppress(AttributeError):
            self.pool.shutdown()
        if self._log is not None:
            self._log.close()


def make_builder(pool: WarmPool) -> Any:
    """A MetaSchedule ``Builder`` that builds through ``pool``."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import PyBuilder

    @derived_object
    class WarmBuilder(PyBuilder):
        def build(self, build_inputs: list[Any]) -> list[Any]:
            return pool.build(build_inputs)

    return WarmBuilder()


def _pickle_by_value() -> None:
    import sys

    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


_pickle_by_value()
