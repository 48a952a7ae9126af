"""A MetaSchedule search on the llvm target, reporting every measured candidate.

A search is a function of its seed, its budget, its database and what it measured: MetaSchedule's
random state is the seed, its candidates are drawn in one thread (with more, which thread draws
which candidate, each from its own random state, depends on timing), and its cost model's guesses
before it has data (numpy's global generator, in ``XGBModel.predict``) are seeded too. Two quiet
tunes of one key then differ only where their measurements ranked candidates differently; left
to chance, two quiet 32-trial searches of one key named winners 13-52 % apart on a 2-core EPYC
(bench/results/timing_noise-epyc.md, run 5). The builds and measurements keep every core.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends.base import Budget, Progress, ProgressFn, SearchResult, Trial, TrialStatus
from backends.tvm.builder import SKIPPED, WarmPool, make_builder
from backends.tvm.database import best_records, normalize_module, open_database
from backends.tvm.intrin import cpu_intrinsics_only
from backends.tvm.runner import make_runner
from backends.tvm.schedule import SCHEDULE_META, trace_json
from tunecache.errors import TuningError

if TYPE_CHECKING:
    from tvm.tirx import PrimFunc

logger = logging.getLogger(__name__)

MAX_ERROR_CHARS = 2000
MAX_TRIALS_PER_ITER = 16
# Each candidate is timed for at least REPEAT × MIN_REPEAT_MS milliseconds, in short repeats of
# which the quickest quarter counts (backends.tvm.runner.quickest).
REPEAT = 12
MIN_REPEAT_MS = 4
RANKED = 5
WORKER_TIMEOUT_S = 10.0  # per build and per measurement: slower candidates are junk
MIN_POPULATION, MAX_POPULATION = 64, 512
SEED_MODULUS = 2**31 - 1  # MetaSchedule's random state (-1 would draw one) and numpy's seed range


@dataclass
class _Recorder:
    """What the measure callback sees, kept in plain Python."""

    total: int
    target: dict[str, Any]
    deadline: float | None
    progress: ProgressFn | None
    trials: list[Trial] = field(default_factory=list)
    best_ms: float | None = None
    error: BaseException | None = None
    proposed: int = 0  # candidates MetaSchedule proposed, measured or skipped
    pool: WarmPool | None = None  # once started: it says when the time left is the tune's
    out_of_time: bool = False  # stopped by the time budget (the rest kept for what follows)

    def record(self, candidates: Any, builder_results: Any, runner_results: Any) -> None:
        self.proposed += len(candidates)
        for cand, built, ran in zip(candidates, builder_results, runner_results, strict=False):
            if SKIPPED in (built.error_msg, ran.error_msg):
                continue  # never measured: the time budget ran out
            config = {
                "schedule": SCHEDULE_META,
                "trace": trace_json(cand.sch.trace),
                "target": self.target,
            }
            self.trials.append(trial_from_results(config, built, ran))
            time_ms = self.trials[-1].time_ms
            if time_ms is not None and (self.best_ms is None or time_ms < self.best_ms):
                self.best_ms = time_ms
        if self.progress is not None and self.error is None:
            try:
                self.progress(
                    Progress(len(self.trials), self.total, self.best_ms, "measured a batch")
                )
            except Exception as exc:  # re-raised once MetaSchedule has returned
                self.error = exc

    def should_stop(self) -> bool:
        """Whether the round just measured is the last: another would not fit (see
        :meth:`WarmPool.out_of_time`), or the search failed."""
        if self.error is not None:
            return True
        self.out_of_time = bool(self.pool and self.pool.out_of_time(next_round=True)) or (
            self.deadline is not None and time.monotonic() >= self.deadline)  # fmt: skip
        return self.out_of_time


@contextlib.contextmanager
def _interrupt_stops(recorder: _Recorder, pools: list[WarmPool]) -> Iterator[None]:
    """For the block, Ctrl-C stops the search at MetaSchedule's next step instead of raising
    inside TVM's C++ (which crashed the process: a segfault, or ``'NoneType' object has no
    attribute 'kill'``), and is raised once MetaSchedule has returned; a second Ctrl-C raises at
    once. Only in the main thread (where Python delivers signals), and where Ctrl-C is not
    ignored (a background job of a script inherits SIGINT ignored: installing a handler made the
    tune stop at a signal meant for the script's foreground)."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    ):
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        recorder.error = KeyboardInterrupt()
        for pool in pools:
            pool.stopped = True
        signal.signal(signal.SIGINT, previous)

    previous = signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def trial_from_results(config: dict[str, Any], built: Any, ran: Any) -> Trial:
    """One candidate's :class:`Trial` from MetaSchedule's ``BuilderResult`` and ``RunnerResult``.

    A failed build is ``compile_error``, a failed run ``runtime_error``, either one that ran out
    of time ``timeout``; ``ok`` trials take the mean of the runner's timings, in milliseconds.
    """
    checks: tuple[tuple[Any, TrialStatus], ...] = (
        (built.error_msg, "compile_error"),
        (ran.error_msg, "runtime_error"),
    )
    for failed, status in checks:
        if failed:
            text = str(failed)
            if "timeout" in text.lower() or "timed out" in text.lower():
                status = "timeout"
            return Trial(config=config, status=status, error=text[:MAX_ERROR_CHARS])
    secs = [float(s.value if hasattr(s, "value") else s) for s in (ran.run_secs or [])]
    if not secs:
        return Trial(config=config, status="runtime_error", error="the runner returned no timings")
    return Trial(config=config, status="ok", time_ms=1e3 * sum(secs) / len(secs))


def _make_callback(recorder: _Recorder) -> Any:
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class RecordTrials(PyMeasureCallback):
        def apply(
            self,
            task_scheduler: Any,
            task_id: int,
            measure_candidates: Any,
            builder_results: Any,
            runner_results: Any,
        ) -> None:
            recorder.record(measure_candidates, builder_results, runner_results)
            # Once its trials are all proposed MetaSchedule ends the task itself, after this
            # batch: ended here too, TVM's check failed the tune ('!task->is_terminated').
            if recorder.should_stop() and recorder.proposed < recorder.total:
                task_scheduler.terminate_task(task_id)

    return RecordTrials()


def _run_meta_schedule(
    mod: Any,
    target: dict[str, Any],
    budget: Budget,
    database: Any,
    pool: WarmPool,
    recorder: _Recorder,
    work_dir: str,
    seed: int,
) -> None:
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.tune import tune_tasks
    from tvm.target import Target

    # TuneContext and tune_tasks directly, not tune_tir: tune_tir reconfigures logging (a DEBUG
    # console handler on stdout); this way MetaSchedule logs through the caller's handlers.
    context = ms.TuneContext(
        mod=mod,
        target=Target(dict(target)),
        space_generator="post-order-apply",
        search_strategy=ms.search_strategy.EvolutionarySearch(
            population_size=population_size(budget.trials)
        ),
        task_name="main",
        rand_state=seed % (SEED_MODULUS - 1) + 1,  # never 0 or -1 (TVM: normalised, random)
        num_threads=1,  # reproducible: see the module
        logger=logging.getLogger(f"{__name__}.meta_schedule"),
    ).clone()
    callbacks = [*ms.measure_callback.MeasureCallback.create("default")]
    callbacks.append(_make_callback(recorder))
    tune_tasks(
        tasks=[context],
        task_weights=[1.0],
        work_dir=work_dir,
        max_trials_global=budget.trials,
        num_trials_per_iter=min(budget.trials, MAX_TRIALS_PER_ITER),
        builder=make_builder(pool),
        runner=make_runner(pool, repeat=REPEAT, min_repeat_ms=MIN_REPEAT_MS),
        database=database,
        measure_callbacks=callbacks,
        task_scheduler="round-robin",
    )


def population_size(trials: int) -> int:
    """The evolutionary search's population: smaller for small budgets (it costs ~1 ms each).

    Until about 100 candidates are measured the XGBoost cost model ranks almost at random, so a
    large population buys little for a small budget.
    """
    return max(MIN_POPULATION, min(MAX_POPULATION, 8 * trials))


@contextlib.contextmanager
def _numpy_seeded(seed: int) -> Iterator[None]:
    """numpy's global generator seeded with ``seed`` for the block, as it was afterwards."""
    import numpy as np

    saved = np.random.get_state()
    np.random.seed(seed % SEED_MODULUS)
    try:
        yield
    finally:
        np.random.set_state(saved)


def tune(
    func: PrimFunc,
    target: dict[str, Any],
    budget: Budget,
    *,
    workdir: Path,
    progress: ProgressFn | None,
    cores: int,
    seed: int = 0,
    after: Callable[[float, float], float] | None = None,
    started: float | None = None,
    workers_follow: bool = True,
) -> SearchResult:
    """Tunes ``func`` for ``target`` with MetaSchedule within ``budget``, building and measuring
    on ``cores`` worker processes; the same ``seed`` and database propose the same candidates.
    With ``after`` (:attr:`backends.base.SearchRequest.after`) it stops early enough to leave
    what follows the search its time: no round is proposed, and no build or timing starts, past
    that, nor when the tune's measurement workers would not have the time to start after it
    (``workers_follow``). ``budget.seconds`` count from ``started`` (a ``time.monotonic()``;
    default: now).

    Raises:
        TuningError: no candidate compiled and ran.
    """
    begin = time.monotonic()
    deadline = (
        None if budget.seconds is None else (begin if started is None else started) + budget.seconds
    )
    recorder = _Recorder(budget.trials, target, deadline, progress)
    pools: list[WarmPool] = []  # the pool, once started: an interrupt stops it
    with _interrupt_stops(recorder, pools):  # from the start: TVM's own set-up is C++ too
        database = open_database(workdir, target)
        mod = normalize_module(func)
        workdir.mkdir(parents=True, exist_ok=True)
        pool = WarmPool(max_workers=cores, timeout_sec=WORKER_TIMEOUT_S,
                        log=workdir / "workers.log")  # workers start now  # fmt: skip
        pools.append(pool)
        pool.deadline, pool.after, pool.stopped = deadline, after, recorder.error is not None
        pool.workers_follow = workers_follow
        recorder.pool = pool
        try:
            with cpu_intrinsics_only(), _numpy_seeded(seed):
                if recorder.error is None:
                    _run_meta_schedule(mod, target, budget, database, pool, recorder,
                                       str(workdir), seed)  # fmt: skip
        except Exception as exc:
            if recorder.error is not None:
                raise recorder.error from exc
            raise TuningError(f"MetaSchedule failed: {str(exc)[-MAX_ERROR_CHARS:]}") from exc
        finally:
            pool.close()
    if recorder.error is not None:
        raise recorder.error
    return _found(database, mod, target, recorder, time.monotonic() - begin)


def _found(database: Any, mod: Any, target: dict[str, Any], recorder: _Recorder,
           seconds: float) -> SearchResult:  # fmt: skip
    """The search's result: the database's best records of ``mod``, and every trial it ran.

    Raises:
        TuningError: none ran.
    """
    records = best_records(database, mod, RANKED + 1)
    if not records:
        errors = "; ".join(t.error.splitlines()[-1] for t in recorder.trials[:3] if t.error)
        raise TuningError(
            f"MetaSchedule measured {len(recorder.trials)} candidates and none ran"
            + (f": {errors}" if errors else "")
        )
    configs = [
        {"schedule": SCHEDULE_META, "trace": trace_json(r.trace), "target": target} for r in records
    ]
    # best_ms is this run's own fastest measurement: the ranked records may hold earlier runs'
    # (the warm start), whose times were measured then, not by this search.
    short = len(recorder.trials) < recorder.total
    stopped = "" if not short else "time" if recorder.out_of_time else "space"
    return SearchResult(configs, recorder.trials, seconds=seconds, best_ms=recorder.best_ms,
                        stopped=stopped)  # fmt: skip
