"""Measurement as typed values: a :class:`Benchmarker` answers :class:`Measurement` values.

A benchmarker measures the candidates of one key: it builds, checks against the golden reference
and times configs, and validates a chosen one in full. Two implementations sit behind the
interface: the isolating harness (:class:`tuner.harness.HarnessBenchmarker`, worker processes that
may die) and :class:`tuner.harness.InProcessBenchmarker` (this process; for kernels that cannot
crash it, and for tests of the pipeline).

Example:
    >>> m = Measurement(status="wrong_answer", error="relative error 0.3 > tolerance 0.0001")
    >>> m.ok, m.trial({"BLOCK": 64}).status
    (False, 'wrong_answer')
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from tunecache.interleave import MIN_ROUNDS
from tunecache.schemas import MAX_TRIAL_ERROR, TimingModel, Trial, TrialStatus, ValidationReport
from tunecache.space import Config
from tunecache.strict import printable_text
from tuner.validation import DEFAULT_SEEDS

# What follows a search, in builds, measurements and checks: re-timing the top 3; validating the
# winner (the edge problem's build; its seeds and the edge problem checked once each: each check
# makes inputs and their reference, as the set-up did, and runs the candidate, together about
# one measurement); the winner, torch eager and the default config timed in alternating rounds,
# as many as the time left allows and at least MIN_ROUNDS reserved for (the default built, when
# the search never tried it).
AFTER_SEARCH_BUILDS = 2
AFTER_SEARCH_MEASURES = 3 + 1 + 3 * MIN_ROUNDS  # one re-timing round: more where time is left
AFTER_SEARCH_CHECKS = len(DEFAULT_SEEDS) + 1  # with the validation's default seeds


@dataclass(frozen=True)
class Measurement:
    """One candidate checked and timed: ``timing`` is set exactly when ``status`` is ``ok``."""

    status: TrialStatus
    timing: TimingModel | None = None
    error: str = ""
    rel_error: float | None = None

    def __post_init__(self) -> None:
        if (self.status == "ok") != (self.timing is not None):
            raise ValueError("a measurement has a timing exactly when its status is 'ok'")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def time_ms(self) -> float | None:
        return None if self.timing is None else self.timing.median_ms

    def trial(self, config: Mapping[str, Any]) -> Trial:
        """This measurement as the trial of ``config``."""
        spread: tuple[float, ...] = ()
        if self.timing is not None:
            spread = (self.timing.min_ms, self.timing.median_ms, self.timing.max_ms)
        error = printable_text(self.error, MAX_TRIAL_ERROR)
        return Trial(config=dict(config), status=self.status, time_ms=self.time_ms, error=error,
                     times_ms=spread)  # fmt: skip


@runtime_checkable
class Pipelines(Protocol):
    """What a benchmarker implements when its candidates compile ahead of their timing (the
    harness's compile farm): told what comes next, it starts compiling it now. The search then
    asks for its next batch before the current one is measured, so the compiles overlap the
    timing; a benchmarker without it compiles each batch as it evaluates it."""

    def prefetch(self, configs: list[Config]) -> None:
        """Says ``configs`` are the next batch to evaluate (``[]``: there is none after all)."""

    def expect_validation(self, configs: Sequence[Mapping[str, Any]]) -> None:
        """Says ``configs`` are about to be re-timed and validated (what their validation builds
        can start compiling)."""


class Benchmarker(abc.ABC):
    """Measures the candidates of one key (its kernel, backend, problem, dtype and device)."""

    @property
    @abc.abstractmethod
    def parallelism(self) -> int:
        """How many configs :meth:`evaluate` builds at once (the search's batch size)."""

    @abc.abstractmethod
    def evaluate(self, configs: list[Config]) -> list[Trial]:
        """Builds ``configs`` (in parallel where it can), then checks and times each, in order."""

    @abc.abstractmethod
    def measure(self, config: Mapping[str, Any] | None, *, again: bool = False) -> Measurement:
        """Checks and times one config (any JSON config; ``None``: the kernel's torch eager
        function); with ``again``, a noisy timing is taken once more (a stand-alone timing: never
        one round of an interleaved comparison, where it would favour the disturbed)."""

    def seconds_per_measure(self) -> float:
        """How long one :meth:`measure` has taken, on average (0 until one has run)."""
        return 0.0

    def seconds_setting_up(self) -> float:
        """The seconds :meth:`evaluate` has waited on one-time work so far (the key set up
        in its first batch), cumulative: the search leaves them out of what a batch costs."""
        return 0.0

    def seconds_per_build(self) -> float:
        """How long one build has taken, on average (0 until one has run)."""
        return 0.0

    def seconds_per_check(self) -> float:
        """What each check of a validation does beyond running the candidate: make fresh inputs
        and their float64 reference, as long as the key's set-up took for them (0 before it)."""
        return 0.0

    def seconds_after_search(self) -> float:
        """What re-timing, validating and timing the baselines of a winner will take, from the
        builds, measurements and set-up seen so far (0 until a measurement has run)."""
        measure = self.seconds_per_measure()
        if measure <= 0:
            return 0.0
        return (AFTER_SEARCH_BUILDS * self.seconds_per_build() + AFTER_SEARCH_MEASURES * measure
                + AFTER_SEARCH_CHECKS * self.seconds_per_check())  # fmt: skip

    @abc.abstractmethod
    def validate(self, config: Mapping[str, Any], seeds: Sequence[int]) -> ValidationReport:
        """The full golden-reference validation of ``config`` (seeds, the edge problem).

        A candidate that dies or hangs yields a failed report naming why, never an exception.
        """
