"""The second half of the pipeline: name a validated, timed winner from ranked candidates.

Every step runs through a :class:`~tuner.measure.Benchmarker` (the isolating harness in the tuner),
whatever search produced the candidates:

1. the search's top few are re-timed in alternating rounds and ordered fastest first (the
   search's own timings, a backend's runner or a strategy's single timings, came from
   different moments);
2. candidates are validated in that order against the golden reference (seeds and the edge
   problem); the first to pass wins, every failure is kept (a report, and a trial);
3. the winner, torch eager and the default config are timed in alternating rounds in one window
   (:mod:`tunecache.interleave`); the default config is a candidate too: unless the winner is
   faster with the whole interval above 1 (an interval reaches at least
   :data:`~tunecache.interleave.REPRODUCIBLE` either side), the default is the winner (when it
   validates).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from backends import SearchResult
from tunecache.errors import TuningError
from tunecache.interleave import (
    MAX_ROUNDS,
    MIN_ROUNDS,
    REPRODUCIBLE,
    ROUNDS,
    median_ratio,
    quiet,
    quiet_rounds,
    ratio,
    rounds,
)
from tunecache.schemas import (
    MAX_NOISE_REASONS,
    BaselineModel,
    ConditionsModel,
    Speedup,
    TimingModel,
    Trial,
    ValidationReport,
)
from tunecache.timing import speedup_text
from tuner.candidates import Emit
from tuner.measure import Benchmarker, Measurement, Pipelines
from tuner.validation import failure_summary


@dataclass
class Winner:
    """A validated, timed winner, its baselines, and what was tried on the way."""

    config: dict[str, Any]
    timing: TimingModel
    report: ValidationReport
    baselines: list[BaselineModel] = field(default_factory=list)
    rejected: list[ValidationReport] = field(default_factory=list)
    trials: list[Trial] = field(default_factory=list)  # measured here, beyond the search's


def _first_note(report: ValidationReport) -> str:
    worst = next(c for c in report.checks if not c.passed)
    return worst.note or f"error {worst.rel_error:.3g} > {worst.tolerance:g}"


def _rejection(config: dict[str, Any], report: ValidationReport) -> Trial:
    """A failed validation as a trial: ``wrong_answer``, or how the candidate died or hung
    (the harness's failed reports start with the status: ``runtime_error: worker killed by
    SIGSEGV during validate``)."""
    note = _first_note(report)
    status = note.partition(":")[0]
    if status not in ("compile_error", "runtime_error", "timeout"):
        status = "wrong_answer"
    return Trial(config=config, status=status, error=note[:2000])  # type: ignore[arg-type]


Ordered = list[tuple[dict[str, Any], Measurement | None]]
RETIME_ROUNDS = ROUNDS  # alternating rounds in which two or more candidates are re-timed


def _order(bench: Benchmarker, found: SearchResult, trials: list[Trial],
           deadline: float | None, checks: int) -> Ordered:  # fmt: skip
    """The candidates in validation order: two or more are re-timed in
    :data:`RETIME_ROUNDS` alternating rounds (:func:`tunecache.interleave.rounds`' rotation) and
    ordered by their median per-round ratio to the search's first, with each one's median round.

    A search's timings (the backend's own runner, a strategy's single timings) came from
    different moments: on a busy machine they rank the moments as much as the candidates. A
    candidate that fails is dropped (its trial kept); none is timed past ``deadline`` (a
    ``time.monotonic()``): the untimed keep the search's order, after the timed. Rounds after
    the first are left out where they would crowd out the validation (``checks``: its checks)
    and final comparison.
    """
    ranked = found.ranked
    if len(ranked) < 2:
        return [(config, None) for config in ranked]
    measured: dict[int, list[Measurement]] = {i: [] for i in range(len(ranked))}
    times: list[dict[int, float]] = []
    for r in range(RETIME_ROUNDS):
        row: dict[int, float] = {}
        alive = list(measured)
        if len(alive) < (1 if r == 0 else 2):  # one left: nothing to order it against
            break
        if r > 0 and not _time_for_a_round(bench, len(alive), checks, deadline):
            break
        turn = r % len(alive)  # who goes first rotates
        for i in alive[turn:] + alive[:turn]:
            if deadline is not None and time.monotonic() >= deadline:
                break
            m = bench.measure(ranked[i])
            if m.ok and m.time_ms is not None:
                measured[i].append(m)
                row[i] = m.time_ms
            else:
                trials.append(m.trial(ranked[i]))
                del measured[i]
        times.append(row)
        if len(row) < len(measured):
            break  # out of time
    timed = [i for i in measured if measured[i]]
    complete = [[row[i] for i in timed] for row in times if all(i in row for i in timed)]
    if complete and len(timed) > 1:
        score = {i: median_ratio(complete, c, 0) for c, i in enumerate(timed)}
    else:  # hardly timed before the deadline: each one's first timing
        score = {i: measured[i][0].time_ms or 0.0 for i in timed}
    timed.sort(key=score.__getitem__)
    untimed = [i for i in measured if not measured[i]]
    return [*((ranked[i], _median_measurement(measured[i])) for i in timed),
            *((ranked[i], None) for i in untimed)]  # fmt: skip


def _time_for_a_round(bench: Benchmarker, contenders: int, checks: int,
                      deadline: float | None) -> bool:  # fmt: skip
    """Whether one more re-timing round of ``contenders`` fits before ``deadline`` with what
    follows it (a validation of ``checks`` checks, and the final comparison's fewest rounds of
    three): under a time budget the search was given time for one round only
    (``AFTER_SEARCH_MEASURES``)."""
    if deadline is None:
        return True
    after = (contenders + 1 + 3 * MIN_ROUNDS) * bench.seconds_per_measure()
    return time.monotonic() + after + checks * bench.seconds_per_check() < deadline


def _median_measurement(measured: Sequence[Measurement]) -> Measurement:
    """The measurement with the median time (the lower middle)."""
    ordered = sorted(measured, key=lambda m: m.time_ms or 0.0)
    return ordered[(len(ordered) - 1) // 2]


def _validated(bench: Benchmarker, found: SearchResult, seeds: Sequence[int], emit: Emit,
               deadline: float | None) -> Winner:  # fmt: skip
    trials: list[Trial] = []
    rejected: list[ValidationReport] = []
    if len(found.ranked) > 1:
        emit(f"re-timing the search's best {len(found.ranked)} in up to {RETIME_ROUNDS} "
             "alternating rounds", phase="time")  # fmt: skip
    order = _order(bench, found, trials, deadline, checks=len(seeds) + 1)  # and the edge
    for i, (config, measured) in enumerate(order):
        emit(f"candidate {i + 1} of {len(order)}", phase="validate", done=i,
             total=len(order))  # fmt: skip
        report = bench.validate(config, seeds)
        if not report.passed:
            emit(f"rejected: {failure_summary(report)}", phase="validate")
            rejected.append(report)
            trials.append(_rejection(config, report))
            continue
        measured = measured or bench.measure(config, again=True)
        if not measured.ok or measured.timing is None:
            trials.append(measured.trial(config))
            continue
        return Winner(config, measured.timing, report, rejected=rejected, trials=trials)
    raise TuningError(
        f"no candidate passed validation ({len(order)} tried, {len(found.trials)} searched); "
        f"first failure: {_first_failure(rejected, trials)}"
    )


def _first_failure(rejected: Sequence[ValidationReport], trials: Sequence[Trial]) -> str:
    """The first rejected candidate's failures (:func:`~tuner.validation.failure_summary`),
    else how the first candidate that failed to run failed, on one line."""
    if rejected:
        return failure_summary(rejected[0])
    failed = [t for t in trials if t.status != "ok"]
    if not failed:
        return "none ran"
    error = (failed[0].error.strip().splitlines() or [""])[0]
    return f"{failed[0].status}: {error}" if error else failed[0].status


def _typical(measured: Sequence[Measurement]) -> TimingModel | None:
    """The timing of the round with the median time (the lower middle), of those that ran."""
    timings = sorted((m.timing for m in measured if m.timing is not None),
                     key=lambda t: t.median_ms)  # fmt: skip
    return timings[(len(timings) - 1) // 2] if timings else None


def _speedup(times: list[list[float]], baseline: int, winner: int,
             floor: float = REPRODUCIBLE) -> Speedup | None:  # fmt: skip
    """``baseline``'s time over the winner's, from the interleaved rounds (``None`` when no
    round timed both), its interval at least ``floor`` either side (:func:`ratio`)."""
    try:
        r = ratio(times, baseline, winner, floor=floor)
    except ValueError:
        return None
    return Speedup(median=r.median, low=r.low, high=r.high, rounds=r.rounds)


def _rounds_that_fit(bench: Benchmarker, contenders: int, deadline: float | None) -> int:
    """:data:`~tunecache.interleave.ROUNDS`, or as many as fit before ``deadline`` (one or more)."""
    if deadline is None:
        return ROUNDS
    per_round = contenders * bench.seconds_per_measure()
    left = deadline - time.monotonic()
    if per_round <= 0:
        return ROUNDS if left > 0 else 1
    return max(1, int(min(ROUNDS, left / per_round)))  # a deadline years away: ROUNDS


def flagged(timing: TimingModel, reason: str) -> TimingModel:
    """``timing`` marked noisy for ``reason`` too."""
    data = timing.model_dump()
    conditions = data["conditions"] or ConditionsModel().model_dump()
    conditions["noise"] = [*conditions["noise"], reason][-MAX_NOISE_REASONS:]
    return TimingModel.model_validate({**data, "noisy": True, "conditions": conditions})


class _Final:
    """The final comparison: the winner, torch eager and the default config timed in
    alternating rounds in one window (:mod:`tunecache.interleave`)."""

    WINNER, EAGER, DEFAULT = 0, 1, 2

    def __init__(self, bench: Benchmarker, contenders: list[Mapping[str, Any] | None],
                 count: int) -> None:  # fmt: skip
        self.bench, self.contenders = bench, contenders
        self.measured: list[list[Measurement]] = [[] for _ in contenders]
        self.times: list[list[float]] = []
        self.add(count)

    def add(self, count: int) -> None:
        """``count`` more rounds."""

        def time_one(i: int) -> float:
            measured = self.bench.measure(self.contenders[i])
            self.measured[i].append(measured)
            return measured.time_ms or 0.0  # failed: left out of every ratio

        self.times += rounds(time_one, len(self.contenders), count, first=len(self.times))

    def typical(self, i: int) -> TimingModel | None:
        """Contender ``i``'s timing of its median round, of the undisturbed rounds (those its
        speedups are read from: a median over every round, disturbed ones too, had eager's time
        and the winner's say 2.44x beside a speedup of 1.62x) or, with none, of all."""
        kept = set(quiet_rounds(self.times))
        measured = self.measured[i]
        return _typical([m for r, m in enumerate(measured) if r in kept] or measured)

    def undecided(self) -> bool:
        """Whether the winner and the default are the same within noise, too few rounds were
        undisturbed to tell (:func:`tunecache.interleave.quiet`), or the winner's timing is
        noisy (:mod:`tunecache.conditions`): more rounds may settle each."""
        if len(quiet(self.times)) < MIN_ROUNDS:
            return True
        typical = self.typical(self.WINNER)
        if typical is not None and typical.noisy:
            return True
        if len(self.contenders) <= self.DEFAULT:
            return False
        # The rounds' own interval: more rounds cannot narrow the floor of a reported one.
        versus = _speedup(self.times, self.DEFAULT, self.WINNER, floor=0.0)
        return versus is not None and versus.low <= 1.0 <= versus.high

    def baseline(self, name: str, i: int, winner: int) -> BaselineModel | None:
        timing = self.typical(i)
        if timing is None:
            return None
        speedup = None if i == winner else _speedup(self.times, i, winner)  # itself: no ratio
        return BaselineModel(name=name, timing=timing, speedup=speedup)


def select_winner(
    bench: Benchmarker,
    found: SearchResult,
    *,
    default: Mapping[str, Any] | None,
    seeds: Sequence[int],
    emit: Emit,
    deadline: float | None = None,
) -> Winner:
    """The best candidate that passes validation, timed against torch eager and ``default``.

    The winner, torch eager and the default config are timed in alternating rounds in one window
    (:data:`~tunecache.interleave.ROUNDS`, more up to :data:`~tunecache.interleave.MAX_ROUNDS` while
    the winner and the default are the same within noise or too few rounds were undisturbed):
    the timings stored are each one's median round, every baseline carries its speedup with an
    interval. The default config replaces the winner unless the winner ran faster with the whole
    interval above 1: a "tuned" config is never stored that is not measurably faster than not
    tuning.

    With a ``deadline`` (a ``time.monotonic()``) the comparison has as many rounds as fit before
    it (one past it), and nothing more is re-timed past it; validation and the baselines always
    run (a record is never stored unchecked).

    Raises:
        TuningError: no candidate passed validation.
    """
    if isinstance(bench, Pipelines):  # what validation builds starts compiling now
        bench.expect_validation([*found.ranked, *([] if default is None else [default])])
    winner = _validated(bench, found, seeds, emit, deadline)
    has_default = default is not None and dict(default) != winner.config
    contenders: list[Mapping[str, Any] | None] = [winner.config, None]
    if has_default:
        assert default is not None
        contenders.append(dict(default))
    count = _rounds_that_fit(bench, len(contenders), deadline)
    final = _compare(bench, contenders, count, emit, deadline)
    winner.timing = final.typical(_Final.WINNER) or winner.timing
    ahead = _Final.WINNER
    if has_default:
        assert default is not None
        winner.trials.append(final.measured[_Final.DEFAULT][0].trial(default))
        ahead = _default_unless_beaten(bench, winner, final, dict(default), seeds, emit)
    undisturbed = len(quiet(final.times))
    if undisturbed < MIN_ROUNDS and count > 1:
        winner.timing = flagged(winner.timing, f"only {undisturbed} of {len(final.times)} "
                                "alternating rounds undisturbed")  # fmt: skip
    baselines = [("torch_eager", _Final.EAGER)]
    if has_default:
        baselines.append(("default_config", _Final.DEFAULT))
    for name, i in baselines:
        if (baseline := final.baseline(name, i, ahead)) is not None:
            winner.baselines.append(baseline)
    return winner


def _compare(bench: Benchmarker, contenders: list[Mapping[str, Any] | None], count: int,
             emit: Emit, deadline: float | None) -> _Final:  # fmt: skip
    """``count`` alternating rounds of ``contenders``, and more (up to ``MAX_ROUNDS``, within
    the deadline) while the winner and the default are undecided."""
    rounds = f"{count} alternating round{'s' if count != 1 else ''}"
    emit(f"the winner against the baselines, {rounds}", phase="time")
    final = _Final(bench, contenders, count)
    while (count > 1 and len(final.times) < MAX_ROUNDS and final.undecided()
           and (deadline is None or time.monotonic() < deadline)):  # fmt: skip
        more = min(ROUNDS, MAX_ROUNDS - len(final.times),
                   _rounds_that_fit(bench, len(contenders), deadline))  # fmt: skip
        emit(f"undecided after {len(final.times)} rounds: {more} more", phase="time")
        final.add(more)
    return final


def _default_unless_beaten(
    bench: Benchmarker, winner: Winner, final: _Final, default: dict[str, Any],
    seeds: Sequence[int], emit: Emit,
) -> int:  # fmt: skip
    """Makes ``default`` the winner (validated) unless the search's winner was faster with the
    whole interval above 1; returns the column of whichever is the winner now."""
    vs_default = _speedup(final.times, _Final.DEFAULT, _Final.WINNER)
    if vs_default is None or vs_default.low > 1.0:
        return _Final.WINNER
    # Not measurably faster than the untuned config: that is the winner if it passes.
    how = speedup_text(vs_default.median, interval=(vs_default.low, vs_default.high),
                       than="the default config")  # fmt: skip
    emit(f"the search's winner was {how}; validating the default", phase="validate")
    report = bench.validate(default, seeds)
    default_timing = final.typical(_Final.DEFAULT)
    if not report.passed or default_timing is None:
        return _Final.WINNER
    winner.config, winner.timing, winner.report = default, default_timing, report
    return _Final.DEFAULT
