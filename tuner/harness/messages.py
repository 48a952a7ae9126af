"""What the harness asks a worker process, and what the worker answers.

Both travel over a ``multiprocessing`` pipe between processes the harness started itself, running
this package's code (:mod:`tuner.harness.worker`): the pool's measurement workers and the compile
farm's. Requests name their task by its JSON (:meth:`~tuner.harness.task.Task.to_json`), which the
worker sets up once and keeps while it is recent.

* ``setup``: make the task's inputs and reference → ``ok`` with the seconds they took
  (``check_s``; sent before a worker's first request for a task, under the start timeout), or
  ``setup_error`` (an unknown kernel, a backend that fails to import)
* ``build``: compile ``config`` → ``ok``, or the failed :class:`~tuner.measure.Measurement`
  (``compile_error``)
* ``measure``: check and time ``config`` (``None``: the kernel's torch eager function, the
  baseline, timed the same way) → its measurement; slower than ``cutoff_ms``, cut short;
  ``again``: a noisy timing is taken once more
* ``validate``: the full golden-reference validation at ``seeds`` → ``ok`` with its ``report``
* ``compile``: the compile farm's: ``config`` compiled for the task's ``target``, with no set-up
  (no inputs, no reference, no device) → ``ok`` with ``seconds`` and what the compiled code says
  (``facts``: its shared memory), ``invalid`` when it needs more shared memory than the target
  allows, ``compile_error`` when it does not compile
* ``stop``: the worker exits, answering nothing

A build, measurement or validation answer carries ``compiles``: the compiles the backend ran in
the worker while answering (where it counts them), which the compile farm keeps at zero.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tunecache.schemas import CheckModel, ValidationReport
from tunecache.strict import printable_text
from tuner.measure import Measurement

Op = Literal["setup", "build", "measure", "validate", "compile", "stop"]
# A trial's statuses, and a task that could not be set up (never a trial's: the tune stops).
AnswerStatus = Literal[
    "ok", "invalid", "compile_error", "runtime_error", "timeout", "wrong_answer", "setup_error"
]


@dataclass(frozen=True)
class Request:
    """One request to a worker (see the module's docstring for each ``op``)."""

    op: Op
    task: Mapping[str, Any] | None = None  # the task's JSON; None only for ``stop``
    config: Mapping[str, Any] | None = None
    cutoff_ms: float | None = None  # measure: cut a candidate slower than this short
    again: bool = False  # measure: a noisy timing is taken once more
    seeds: tuple[int, ...] = ()  # validate: the random inputs checked

    def bound(self, task: Mapping[str, Any], config: Mapping[str, Any] | None) -> Request:
        """This request for ``task`` and ``config``."""
        return dataclasses.replace(self, task=task, config=None if config is None else dict(config))


@dataclass(frozen=True)
class Answer:
    """A worker's answer, or the harness's own when the worker died or ran out of time."""

    status: AnswerStatus
    error: str = ""
    compiles: int = 0  # compiles the backend ran while answering
    measurement: Measurement | None = None  # measure; a build that failed
    report: ValidationReport | None = None  # validate
    seconds: float = 0.0  # compile: how long it took
    facts: Mapping[str, int] = field(default_factory=dict)  # compile: what the code says
    compile_s: float | None = None  # measured after the farm compiled it: that compile's seconds
    measure_s: float | None = None  # ... and the check and timing's wall time
    check_s: float | None = None  # setup: the seconds its inputs and reference took

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def of(cls, measured: Measurement) -> Answer:
        """A measurement as an answer."""
        return cls(status=measured.status, error=measured.error, measurement=measured)

    def as_measurement(self) -> Measurement:
        """The measurement this answer holds, or the failure it says (``setup_error`` counts as
        ``runtime_error``: a trial has no such status)."""
        if self.measurement is not None:
            return self.measurement
        if self.status == "ok":
            raise ValueError("an 'ok' answer without a measurement is not a measurement")
        status = "runtime_error" if self.status == "setup_error" else self.status
        return Measurement(status=status, error=self.error)

    def plus(self, **changes: Any) -> Answer:
        """This answer with ``changes``."""
        return dataclasses.replace(self, **changes)


READY = Answer(status="ok")  # a worker's hello, once it has started


def failed_report(problem: Mapping[str, int], seeds: Sequence[int], note: str) -> ValidationReport:
    """A failed validation report saying why the check could not run (the worker died, …)."""
    check = CheckModel(
        problem=dict(problem), seed=seeds[0], rel_error=None, max_abs_error=None,
        tolerance=1.0, passed=False, note=printable_text(note, 500),
    )  # fmt: skip
    return ValidationReport(passed=False, tolerance=1.0, max_rel_error=None, checks=[check])
