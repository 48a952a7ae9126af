"""The verifier: re-checks uploaded records on its own device before a team serves them as verified.

An uploader is trusted with nothing: its validation and its time are claims. A verifier (a token
with the ``verify`` scope, ``tunecache daemon --verify``) claims records of its device's arch and
backends (the uploader with the fewest waiting first, its disputed ones before the rest), and
for each:

1. gives it back as ``unverifiable`` when it cannot run it as tuned: other software versions,
   a kernel it does not have, other kernel sources;
2. fails it when its problem is not the kernel's, or its config is outside the backend's closed
   schema or the kernel's space (nothing outside them is ever built); gives it back when it
   cannot fit in this device's memory;
3. validates it against the float64 golden reference in its own worker processes: fresh seeds of
   its own, poisoned outputs, the kernel's edge problem, and every problem a consumer disputed it
   at (one the record may serve: its own, or one of its shape bucket);
4. times it with the device's timer, at the record's problem.

The server then serves it as ``verified`` (its time from now on the verifier's, the uploader's
flagged when more than 20 % faster) or never again (``rejected``).

Example:
    >>> with Client(url) as client:  # doctest: +SKIP
    ...     Verifier(client, VerifierOptions(once=True)).run()
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from backends import get_backend
from tunecache.client import Client
from tunecache.configcheck import config_problem
from tunecache.environment import environment_for
from tunecache.errors import InvalidInput, ServerError, TuningError, one_line
from tunecache.key import Key
from tunecache.policies import bucket_policy
from tunecache.schemas import MAX_CHECKS, ValidationReport
from tunecache.space import Config
from tunecache.strict import printable_text
from tunecache.timing import DEFAULT_TIMER, TimerSettings
from tunecache.verification import VerificationCreate, VerifyTask
from tuner.daemon import Worker
from tuner.harness import Harness, Task
from tuner.polling import leased, poll, release
from tuner.tune import check_memory
from workloads import get_workload

logger = logging.getLogger(__name__)
SEEDS = (101, 102, 103)  # not the tuner's (1, 2, 3): the uploader could not have fitted them


@dataclass(frozen=True)
class VerifierOptions:
    """How a verifier works: its device and backends, seeds, timer, lease and polling.

    Attributes:
        timer_ref: ``"module:function"`` of a timer to use instead of the device's (tests).
        once: stop when nothing is left to verify, instead of polling.
    """

    device: str = "cpu"
    backends: tuple[str, ...] | None = None
    seeds: tuple[int, ...] = SEEDS
    timer: TimerSettings = DEFAULT_TIMER
    timer_ref: str | None = None
    lease_seconds: float = 600.0
    poll_seconds: float = 5.0
    once: bool = False
    workers: int | None = None
    kernels: tuple[str, ...] = ()  # users' kernels' packages it may import (DaemonOptions)


class Verifier(Worker):
    """Claims, re-checks and reports records until stopped (or, ``once``, out of records)."""

    def __init__(self, client: Client, options: VerifierOptions) -> None:
        super().__init__(client, options.device, options.backends, role=":verify",
                         kernels=options.kernels)  # fmt: skip
        self.options = options
        self.outcomes: dict[int, str] = {}  # record id → passed | failed | unverifiable

    def run(self) -> int:
        """Works until stopped; returns how many records it verified or rejected."""
        arch = self.arch()
        logger.info("%s: verifying %s records of %s", self.worker, ",".join(self.backends), arch)
        with Harness(workers=self.options.workers) as harness:
            poll(lambda: self._claim(arch),
                 lambda task: self._report(task, self.finding(task, harness)),
                 stopping=self.stopping, once=self.options.once,
                 every=self.options.poll_seconds,
                 give_back=lambda task: release(self.client, task, self.worker))  # fmt: skip
        return sum(outcome != "unverifiable" for outcome in self.outcomes.values())

    def _claim(self, arch: str) -> VerifyTask | None:
        """The next record to check; ``None`` with ``once`` when it is one this run reported
        already (a server handing it out again: a ``--once`` verifier checked one record 164
        times and never ended). Its lease lapses."""
        task = self.client.claim_verification(self.worker, device_arch=arch,
                                              backends=self.backends,
                                              lease_seconds=self.options.lease_seconds)  # fmt: skip
        if task is not None and self.options.once and task.record.id in self.outcomes:
            logger.warning("record #%d: handed out again after this --once verifier reported it "
                           "(%s): not checking it, not claiming any more", task.record.id,
                           self.outcomes[task.record.id])  # fmt: skip
            return None
        return task

    def _report(self, task: VerifyTask, result: VerificationCreate) -> bool:
        """Sends the finding; whether it counts as work done (``False``: not stored, or
        ``unverifiable``, and the next claim waits a while: a server refusing every finding of
        a record it hands out again was claimed from 11 times a second)."""
        record = task.record
        try:
            stored = self.client.submit_verification(record.id, result)
        except ServerError as exc:  # the lease was lost: another verifier will take it
            logger.warning("record #%d: finding not stored: %s", record.id, exc)
            return False
        self.outcomes[record.id] = result.outcome
        logger.info("record #%d %s: %s%s", record.id, record.key.to_key().short(), stored.status,
                    f" ({result.error})" if result.error else "")  # fmt: skip
        return result.outcome != "unverifiable"

    def finding(self, task: VerifyTask, harness: Harness) -> VerificationCreate:
        """:meth:`check`, or where the check itself raised (a record this verifier cannot run,
        a fault of its own), ``unverifiable`` saying why: the verifier goes on to the next."""
        try:
            with leased(self.client, task, self.worker, self.options.lease_seconds):
                return self.check(task, harness)  # a check longer than its lease is renewed
        except (InvalidInput, TuningError, ValueError, TypeError) as exc:
            logger.warning("record #%d: not checked: %s: %s", task.record.id,
                           type(exc).__name__, exc)  # fmt: skip
            if isinstance(exc, TuningError):  # from the workers: an answer left unread
                harness.restart(busy_only=True)  # is not the next check's
            return self._finding("unverifiable", error=f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a kernel's code run here failing as nothing foresaw: a record
            # that ended the verifier ended each that claimed it next
            logger.error("record #%d: unexpected error", task.record.id, exc_info=True)
            harness.restart()
            return self._finding("unverifiable", error=f"internal error: {one_line(exc)}")

    def check(self, task: VerifyTask, harness: Harness) -> VerificationCreate:
        """The finding on one leased record (never raises on what the record holds)."""
        record = task.record
        key = record.key.to_key()
        if (why := self._cannot_run(key)) is not None:
            return self._finding("unverifiable", error=why)
        try:  # stored before the server checked a built-in kernel's problem at upload
            get_workload(key.kernel).problem(dict(key.problem))
        except InvalidInput as exc:
            return self._finding("failed", error=f"its problem is not the kernel's: {exc}")
        if (why := self._too_big(key, key.problem)) is not None:
            return self._finding("unverifiable", error=why)
        config = dict(record.config)
        why = config_problem(key.backend, config, kernel=key.kernel, device=key.device.kind)
        if why is not None:
            return self._finding("failed", error=f"its config is not a {key.backend} config: {why}")
        if (why := self._outside_space(key, config)) is not None:
            return self._finding("failed", error=f"its config is outside the kernel's space: {why}")
        reports = []
        for problem in [dict(key.problem), *self._servable(key, task.disputed_problems)]:
            bench = harness.benchmarker(self._task(key, problem))
            reports.append(bench.validate(config, self.options.seeds))
            if not reports[-1].passed:
                return self._finding("failed", validation=merged(reports))
        measured = harness.benchmarker(self._task(key, dict(key.problem))).measure(config)
        if not measured.ok or measured.timing is None:
            return self._finding("failed", validation=merged(reports),
                                 error=f"{measured.status}: {measured.error}")  # fmt: skip
        # It answers the task's disputes: each run, or found beyond this machine or the bucket.
        answered = [dict(p) for p in task.disputed_problems]
        return self._finding("passed", validation=merged(reports), timing=measured.timing,
                             disputed_problems=answered)  # fmt: skip

    def _finding(self, outcome: str, **fields: Any) -> VerificationCreate:
        if "error" in fields:  # a compiler's or the record's text: printable, as the field takes
            fields["error"] = printable_text(fields["error"], 2000)
        return VerificationCreate(worker=self.worker, outcome=outcome,  # type: ignore[arg-type]
                                  device_name=self.device.fingerprint.name, **fields)  # fmt: skip

    def _cannot_run(self, key: Key) -> str | None:
        """Why this machine cannot run ``key`` as it was tuned, or ``None``."""
        if key.device.arch != self.device.fingerprint.arch:
            return f"tuned on {key.device.arch}; this verifier has {self.device.fingerprint.arch}"
        if (why := self.refused(key.kernel)) is not None:
            return why
        installed = environment_for(key.backend)
        if dict(key.environment) != installed:
            return f"tuned with {dict(key.environment)}; here {installed}"
        try:
            workload = get_workload(key.kernel)
        except InvalidInput as exc:
            return str(exc)
        if workload.source_hash(key.backend) != key.source_hash:
            return (f"tuned with kernel sources {key.source_hash}; here "
                    f"{workload.source_hash(key.backend)}")  # fmt: skip
        return None

    def _too_big(self, key: Key, problem: Mapping[str, Any]) -> str | None:
        """Why ``key`` at ``problem`` cannot fit in this verifier's device memory, or ``None``."""
        try:
            check_memory(replace(key, problem=dict(problem), device=self.device.fingerprint))
        except InvalidInput as exc:
            return str(exc)
        return None

    def _outside_space(self, key: Key, config: Mapping[str, Any]) -> str | None:
        """Why ``config`` is outside the kernel's enumerated space where it names one (Triton's
        spaces, TVM's knob spaces; a MetaSchedule trace or an Inductor config names none)."""
        workload = get_workload(key.kernel)
        problem = {k: int(v) for k, v in key.problem.items()}
        try:
            space = get_backend(key.backend).space(workload, problem, key.dtype)
            required = set(space.params) - set(space.defaults) if space is not None else set()
            if space is None or not required <= set(config):
                return None  # not a point of the space (a trace, Inductor settings, a default)
            return space.prune_reason(Config.of(config))
        except InvalidInput as exc:
            return str(exc)

    def _servable(self, key: Key, problems: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The disputed problems the record may serve (its bucket's), each once: a dispute at
        another problem could not have come from a lookup, and is not run."""
        buckets = bucket_policy(key.kernel)
        own = buckets.bucket(key.problem)
        kept: list[dict[str, Any]] = []
        for problem in problems:
            if dict(problem) in kept:  # a server may list one again: run once
                continue
            if dict(problem) != dict(key.problem) and buckets.bucket(problem) == own:
                if (why := self._too_big(key, problem)) is not None:
                    logger.warning("%s: a dispute not run: %s", key.short(), why)
                    continue
                kept.append(dict(problem))
            elif dict(problem) != dict(key.problem):
                logger.warning("%s: a dispute at %s, which it cannot serve, is ignored",
                               key.short(), dict(problem))  # fmt: skip
        return kept

    def _task(self, key: Key, problem: Mapping[str, Any]) -> Task:
        return Task(backend=key.backend, workload=key.kernel, problem=dict(problem),
                    dtype=key.dtype, device=key.device.kind, timer=self.options.timer,
                    timer_ref=self.options.timer_ref)  # fmt: skip


def merged(reports: Sequence[ValidationReport]) -> ValidationReport:
    """One report of several checks: passed when all did, the worst error, every check."""
    checks = [check for report in reports for check in report.checks][:MAX_CHECKS]
    errors = [c.rel_error for c in checks]
    worst = None if None in errors else max(e for e in errors if e is not None)
    return ValidationReport(
        passed=all(r.passed for r in reports) and all(c.passed for c in checks),
        tolerance=max(r.tolerance for r in reports),
        max_rel_error=worst,
        checks=checks,
        reference="float64 golden reference, the verifier's seeds and edge problem",
    )
