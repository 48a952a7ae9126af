"""The second half of the pipeline: name a validated, timed winner from ranked candidates.

Every step runs through a :class:`~tuner.measure.Benchmarker` (the isolating harness in the tuner),
whatever search produced the candidates:

1. a strategy's top few are re-timed and ordered fastest first (a backend's own order stands);
2. candidates are validated in that order against the golden reference (seeds and the edge
   problem); the first to pass wins, every failure is kept (a report, and a trial);
3. the winner, torch eager and the default config are timed; the default config is a candidate
   too: when it is faster and validates, it is the winner.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tunecache.errors import TuningError
from tunecache.schemas import BaselineModel, TimingModel, Trial, ValidationReport
from tuner.candidates import Candidates, Emit
from tuner.measure import Benchmarker, Measurement


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


def _order(bench: Benchmarker, found: Candidates, trials: list[Trial],
           deadline: float | None) -> Ordered:  # fmt: skip
    """The candidates in validation order, with their re-timing where there was one (none past
    ``deadline``, a ``time.monotonic()``: the rest keep the search's order, after)."""
    if not found.retime:
        return [(config, None) for config in found.ranked]
    timed: list[tuple[dict[str, Any], Measurement]] = []
    for i, config in enumerate(found.ranked):
        if deadline is not None and time.monotonic() >= deadline:
            timed.sort(key=lambda item: item[1].time_ms or 0.0)
            return [*timed, *((c, None) for c in found.ranked[i:])]
        measured = bench.measure(config)
        if measured.ok:
            timed.append((config, measured))
        else:
            trials.append(measured.trial(config))
    timed.sort(key=lambda item: item[1].time_ms or 0.0)
    return [(config, measured) for config, measured in timed]


def _validated(bench: Benchmarker, found: Candidates, seeds: Sequence[int], emit: Emit,
               deadline: float | None) -> Winner:  # fmt: skip
    trials: list[Trial] = []
    rejected: list[ValidationReport] = []
    order = _order(bench, found, trials, deadline)
    for i, (config, measured) in enumerate(order):
        emit(f"candidate {i + 1} of {len(order)}", phase="validate", done=i,
             total=len(order))  # fmt: skip
        report = bench.validate(config, seeds)
        if not report.passed:
            emit(f"rejected: {_first_note(report)}", phase="validate")
            rejected.append(report)
            trials.append(_rejection(config, report))
            continue
        measured = measured or bench.measure(config)
        if not measured.ok or measured.timing is None:
            trials.append(measured.trial(config))
            continue
        return Winner(config, measured.timing, report, rejected=rejected, trials=trials)
    raise TuningError(
        f"no candidate passed validation ({len(order)} tried, {len(found.trials)} searched); "
        f"first failure: {rejected[0].checks if rejected else trials[:1]}"
    )


def select_winner(
    bench: Benchmarker,
    found: Candidates,
    *,
    default: Mapping[str, Any] | None,
    seeds: Sequence[int],
    emit: Emit,
    deadline: float | None = None,
) -> Winner:
    """The best candidate that passes validation, timed against torch eager and ``default``.

    Past ``deadline`` (a ``time.monotonic()``) nothing more is re-timed; validation and the
    baselines always run (a record is never stored unchecked).

    Raises:
        TuningError: no candidate passed validation.
    """
    bench.expect_validation([*found.ranked, *([] if default is None else [default])])
    winner = _validated(bench, found, seeds, emit, deadline)
    emit("the baselines", phase="time")
    eager = bench.measure(None)
    if eager.timing is not None:
        winner.baselines.append(BaselineModel(name="torch_eager", timing=eager.timing))
    if default is None or dict(default) == winner.config:
        return winner
    measured = bench.measure(default)
    winner.trials.append(measured.trial(default))
    if measured.timing is None:
        return winner
    winner.baselines.append(BaselineModel(name="default_config", timing=measured.timing))
    if measured.timing.median_ms < winner.timing.median_ms:
        # The untuned config is a candidate too: never store a "tuned" config slower than it.
        emit("the default config timed faster than the search's winner; validating it",
             phase="validate")  # fmt: skip
        report = bench.validate(default, seeds)
        if report.passed:
            winner.config, winner.timing, winner.report = dict(default), measured.timing, report
    return winner
