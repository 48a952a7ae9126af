"""Drive a search strategy against an evaluator under a budget, and log every trial.

The evaluator measures a batch of configs (the measurement harness, in parallel; or a landscape
replayed as a simulated device). The loop stops at the first of: ``budget.trials`` configs
evaluated, ``budget.seconds`` spent (checked between batches), ``budget.patience`` consecutive
trials that did not improve the best time, or the strategy having nothing left to propose.

``budget.seconds`` bounds more than the search when ``after`` is given: it says how many seconds
the work that follows the search (re-timing, validation, baselines) will take, and the loop
starts no batch that, at the last batch's seconds per candidate, would leave less than that.
The seconds count from ``started`` (a tune's start: starting its workers counts too). The
seconds a batch spent on one-time work (``set_up``: in a key's first batch, the key set up on the
workers, or through the compile farm on the timing process) are left out of that rate: a cold
first batch once stopped a 25 s search on an H200 at 9 of its 48 trials, 10 s of its budget
unspent.

With ``prefetch`` the loop is pipelined: it asks for the next batch and hands it to ``prefetch``
(which starts compiling it) before it evaluates the current one, so the strategy hears of a
batch's results one batch later; a batch prefetched when the search stops is dropped
(``prefetch([])``).

Example:
    >>> from backends.base import Budget, Trial
    >>> from tunecache.space import SearchSpace
    >>> from tuner.search import get_strategy
    >>> space = SearchSpace({"BLOCK": (16, 32, 64, 128)})
    >>> def evaluate(configs):
    ...     return [Trial(config=c.to_json(), status="ok", time_ms=abs(c["BLOCK"] - 64) + 1.0)
    ...             for c in configs]
    >>> log = run_search(get_strategy("exhaustive", space), evaluate, Budget(trials=10))
    >>> str(log.best[0]), log.stopped_because, len(log)
    ('BLOCK=64', 'exhausted', 4)
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from backends.base import Budget, Progress, ProgressFn, SearchResult, Trial
from tunecache.errors import TuningError
from tunecache.space import Config
from tuner.search.base import SearchStrategy

logger = logging.getLogger(__name__)

Evaluator = Callable[[list[Config]], list[Trial]]
StopReason = Literal["trials", "seconds", "patience", "exhausted"]


def trial_time(trial: Trial) -> float | None:
    """The trial's time if it is a usable measurement (``ok`` and finite), else ``None``."""
    if trial.status != "ok" or trial.time_ms is None or not math.isfinite(trial.time_ms):
        return None
    return trial.time_ms


@dataclass
class SearchLog:
    """Every ``(config, trial)`` in evaluation order, and why the search stopped."""

    entries: list[tuple[Config, Trial]] = field(default_factory=list)
    stopped_because: StopReason = "exhausted"
    strategy: str = ""
    seconds: float = 0.0
    #: of ``seconds``, those spent in the strategy's ``ask`` and ``tell``: the evaluator (the
    #: timing process) waits meanwhile, so this is what choosing costs the search in time
    choosing: float = 0.0

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[tuple[Config, Trial]]:
        return iter(self.entries)

    @property
    def trials(self) -> list[Trial]:
        return [trial for _, trial in self.entries]

    @property
    def best(self) -> tuple[Config, Trial] | None:
        """The fastest ``ok`` entry (the first one on a tie), or ``None`` if none succeeded."""
        ranked = self.ranked()
        return ranked[0] if ranked else None

    @property
    def best_ms(self) -> float | None:
        best = self.best
        return None if best is None else trial_time(best[1])

    def ranked(self) -> list[tuple[Config, Trial]]:
        """The ``ok`` entries, fastest first (stable, so ties keep evaluation order)."""
        ok = [(c, t) for c, t in self.entries if trial_time(t) is not None]
        return sorted(ok, key=lambda entry: trial_time(entry[1]) or 0.0)

    def result(self, top: int | None = None) -> SearchResult:
        """The search's result: its ``top`` fastest configs (all that ran by default), best
        first, and every trial."""
        ranked = [config.to_json() for config, _ in self.ranked()[:top]]
        return SearchResult(ranked, self.trials, self.strategy, self.seconds, self.best_ms)

    def best_after(self, n: int) -> float | None:
        """The best time among the first ``n`` evaluations, or ``None`` if none succeeded."""
        times = [trial_time(t) for _, t in self.entries[:n]]
        return min((t for t in times if t is not None), default=None)


def run_search(
    strategy: SearchStrategy,
    evaluate: Evaluator,
    budget: Budget,
    *,
    batch_size: int = 1,
    progress: ProgressFn | None = None,
    clock: Callable[[], float] = time.monotonic,
    after: Callable[[], float] | None = None,
    prefetch: Callable[[list[Config]], None] | None = None,
    set_up: Callable[[], float] | None = None,
    started: float | None = None,
) -> SearchLog:
    """Asks ``strategy`` for configs, measures them with ``evaluate``, and tells it the results.

    Args:
        strategy: proposes configs; told each result (``None`` for a failed trial).
        evaluate: measures a batch of configs; returns one :class:`Trial` per config, in order.
        budget: trials, seconds and patience limits.
        batch_size: configs asked for and evaluated together (the harness runs them in parallel).
        progress: called after every batch. clock: seconds, monotonic (tests inject one).
        after, set_up, prefetch: the seconds of work after the search within ``budget.seconds``;
            of one-time work waited on so far; told each batch ahead (the module's docstring).
        started: when ``budget.seconds`` began, a ``clock()`` reading (by default, now).

    Returns:
        The log of every evaluated config and why the loop stopped.

    Raises:
        TuningError: the evaluator returned a different number of trials than configs.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    searching = clock()
    started = searching if started is None else started
    log = SearchLog(strategy=getattr(strategy, "name", type(strategy).__name__))
    streak, asker = _Streak(), _Asker(strategy, prefetch, log, clock)
    per_candidate, total = 0.0, _total(strategy, budget)  # per_candidate: the last batch's s
    try:  # an error too (a cancelled job's progress) takes back the configs compiling ahead
        while True:
            size = min(batch_size, budget.trials - len(log))
            ahead = per_candidate * size + (after() if after is not None else 0.0)
            reason = _should_stop(log, budget, streak.stale, clock() - started, ahead)
            if reason is None:
                batch, exhausted = asker.take(size, batch_size, budget.trials - len(log))
                spent = _evaluate(batch, evaluate, strategy, streak, log, clock, set_up)
                per_candidate = per_candidate if spent is None else spent
                if batch and progress is not None:
                    progress(Progress(len(log), total, streak.best,
                                      f"{log.strategy}: {batch[-1]}"))  # fmt: skip
                reason = "exhausted" if exhausted else None
            if reason is not None:
                log.stopped_because = reason
                break
    finally:
        asker.close()
    log.seconds = clock() - searching
    if logger.isEnabledFor(logging.DEBUG):  # asks ``after`` again: only when it is shown
        _say_stopped(log, clock() - started, per_candidate * size, after)
    return log


def _say_stopped(log: SearchLog, elapsed: float, batch_s: float,
                 after: Callable[[], float] | None) -> None:  # fmt: skip
    """Logs why the search stopped, with what it projected (``--verbose`` in the GPU benches)."""
    logger.debug("search %s stopped (%s) after %d trials, %.2f s in; a batch %.2f s, then %.2f s",
                 log.strategy, log.stopped_because, len(log), elapsed, batch_s,
                 after() if after is not None else 0.0)  # fmt: skip


def _should_stop(
    log: SearchLog, budget: Budget, stale: int, elapsed: float, ahead: float = 0.0
) -> StopReason | None:
    """Which budget limit the search has reached, checked between batches, or ``None``.

    ``ahead``: the seconds the next batch and what follows the search are expected to take. The
    first batch always runs.
    """
    if len(log) >= budget.trials:
        return "trials"
    if budget.patience is not None and stale >= budget.patience:
        return "patience"
    if (
        budget.seconds is not None
        and len(log) > 0
        and (elapsed >= budget.seconds or elapsed + ahead > budget.seconds)
    ):
        return "seconds"
    return None


def _total(strategy: SearchStrategy, budget: Budget) -> int:
    """The trials a search will run at most: its budget, or its space where that is smaller
    (``--landscape``'s budget is the whole space, however large the count asked for)."""
    space = getattr(strategy, "space", None)
    return min(budget.trials, len(space.valid())) if space is not None else budget.trials


def _evaluate(batch: list[Config], evaluate: Evaluator, strategy: SearchStrategy, streak: _Streak,
              log: SearchLog, clock: Callable[[], float],
              set_up: Callable[[], float] | None) -> float | None:  # fmt: skip
    """Measures ``batch``, tells ``strategy`` each result and logs it; returns the seconds per
    candidate that took, one-time set-up left out (``None`` for no batch)."""
    started, setting_up = clock(), set_up() if set_up is not None else 0.0
    trials = evaluate(batch) if batch else []
    if len(trials) != len(batch):
        raise TuningError(f"evaluator returned {len(trials)} trials for {len(batch)}")
    began = clock()
    for config, trial in zip(batch, trials, strict=True):
        strategy.tell(config, streak.see(trial))
        log.entries.append((config, trial))
    log.choosing += clock() - began
    if not batch:
        return None
    once = set_up() - setting_up if set_up is not None else 0.0
    logger.debug("batch of %d: %.2f s, of which %.2f s one-time set-up",
                 len(batch), clock() - started, once)  # fmt: skip
    return max(0.0, clock() - started - once) / len(batch)


@dataclass
class _Streak:
    """The best time so far, and how many trials in a row have not improved it."""

    best: float | None = None
    stale: int = 0

    def see(self, trial: Trial) -> float | None:
        """Counts ``trial``; returns its time (``None``: failed), as a strategy is told it."""
        time_ms = trial_time(trial)
        if time_ms is not None and (self.best is None or time_ms < self.best):
            self.best, self.stale = time_ms, 0
        else:
            self.stale += 1
        return time_ms


class _Asker:
    """Batches from a strategy. With ``prefetch``, each batch is told to it when asked, and the
    next batch is asked (and told) before the current one is evaluated; ``close`` tells it ``[]``
    when that next batch will not be evaluated after all."""

    def __init__(
        self,
        strategy: SearchStrategy,
        prefetch: Callable[[list[Config]], None] | None,
        log: SearchLog,
        clock: Callable[[], float],
    ) -> None:
        self.strategy = strategy
        self.prefetch = prefetch
        self.log, self.clock = log, clock  # whose ``choosing`` counts the asks' seconds
        self.pending: tuple[list[Config], bool] | None = None  # asked and prefetched already

    def take(self, size: int, batch_size: int, left: int) -> tuple[list[Config], bool]:
        """The next batch (up to ``size`` configs, or the one asked ahead) and whether the
        strategy ran out; ``left``: trials left in the budget, of which up to ``batch_size``
        after this batch are asked ahead."""
        if self.pending is None:
            batch, exhausted = self._ask(size)
            if self.prefetch is not None and batch:
                self.prefetch(batch)
        else:
            batch, exhausted = self.pending
        self.pending = None
        room = min(batch_size, left - len(batch))
        if self.prefetch is not None and not exhausted and room > 0:
            self.pending = self._ask(room)
            if self.pending[0]:
                self.prefetch(self.pending[0])
        return batch, exhausted

    def _ask(self, n: int) -> tuple[list[Config], bool]:
        began = self.clock()
        try:
            return _ask_batch(self.strategy, n)
        finally:
            self.log.choosing += self.clock() - began

    def close(self) -> None:
        if self.prefetch is not None and self.pending is not None and self.pending[0]:
            self.prefetch([])


def _ask_batch(strategy: SearchStrategy, n: int) -> tuple[list[Config], bool]:
    """Up to ``n`` configs from ``strategy``, and whether it ran out (returned ``None``)."""
    batch: list[Config] = []
    while len(batch) < n:
        config = strategy.ask()
        if config is None:
            return batch, True
        batch.append(config)
    return batch, False
