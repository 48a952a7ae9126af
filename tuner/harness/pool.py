"""A pool of measurement workers that survives whatever a candidate does.

:meth:`Harness.evaluate` takes a batch of configs and

1. builds them in parallel, one per worker process (compilation is CPU work), then
2. checks and times them one at a time (measurements must not share the device),

recording a candidate that raises, segfaults, or outlives its timeout as failed — ``compile_error``,
``runtime_error``, ``timeout`` or ``wrong_answer`` — replacing its worker, and going on. A wrong
answer never gets a time, so it can never win.

Example:
    >>> job = Job(backend="tvm", workload="matmul", problem={"M": 64, "N": 64, "K": 64},
    ...           dtype="float32")  # doctest: +SKIP
    >>> with Harness(job, workers=2) as harness:  # doctest: +SKIP
    ...     trials = harness.evaluate(list(space.configs())[:8])
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from backends import Trial
from tunecache.errors import TuningError
from tunecache.schemas import CheckModel, ValidationReport
from tunecache.space import Config
from tuner.harness.job import Job
from tuner.harness.worker import worker_main

logger = logging.getLogger(__name__)
_CONTEXT = multiprocessing.get_context("spawn")  # no fork: CUDA and thread pools don't survive it
_EAGER = Config.of({"baseline": "torch_eager"})  # marks a request that times torch eager


@dataclass
class _Slot:
    process: BaseProcess
    conn: Connection
    config: Config | None = None  # the request in flight
    deadline: float = 0.0
    built: set[Config] = field(default_factory=set)  # what this process has compiled


def _death(process: BaseProcess) -> str:
    process.join(timeout=1)
    code = process.exitcode
    if code is not None and code < 0:
        try:
            return f"worker killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"worker killed by signal {-code}"
    return f"worker exited with code {code}"


class Harness:
    """Measures candidates of one :class:`Job` in isolated worker processes.

    Args:
        job: the key being tuned.
        workers: worker processes (parallel builds); defaults to the CPU count.
        build_timeout: seconds one build may take before its worker is killed.
        run_timeout: seconds one check-and-time may take before its worker is killed.
        start_timeout: seconds a worker may take to start (import frameworks, make inputs).
    """

    def __init__(
        self,
        job: Job,
        *,
        workers: int | None = None,
        build_timeout: float = 300.0,
        run_timeout: float = 60.0,
        start_timeout: float = 180.0,
    ) -> None:
        self.job = job
        self.build_timeout = build_timeout
        self.run_timeout = run_timeout
        self.start_timeout = start_timeout
        self.failures: Counter[str] = Counter()
        self.replaced = 0
        count = max(1, workers or os.cpu_count() or 1)
        self._slots = [self._start() for _ in range(count)]
        for slot in self._slots:
            self._await_ready(slot)

    @property
    def workers(self) -> int:
        """How many worker processes build in parallel."""
        return len(self._slots)

    # -- worker lifecycle -----------------------------------------------------------------
    def _start(self) -> _Slot:
        parent, child = _CONTEXT.Pipe()
        process = _CONTEXT.Process(
            target=worker_main, args=(child, self.job.to_json()), daemon=True
        )
        process.start()
        child.close()
        return _Slot(process=process, conn=parent)

    def _await_ready(self, slot: _Slot) -> None:
        if not slot.conn.poll(self.start_timeout):
            self._kill(slot)
            raise TuningError(f"a measurement worker did not start in {self.start_timeout:g} s")
        try:
            hello = slot.conn.recv()
        except EOFError:
            death = _death(slot.process)
            raise TuningError(f"a measurement worker died at start: {death}") from None
        if hello.get("status") != "ready":
            self._kill(slot)
            raise TuningError(f"a measurement worker could not set up: {hello.get('error')}")

    def _kill(self, slot: _Slot) -> None:
        if slot.process.is_alive():
            slot.process.kill()
        slot.process.join(timeout=5)
        slot.conn.close()

    def _replace(self, index: int) -> None:
        self._kill(self._slots[index])
        self.replaced += 1
        self._slots[index] = self._start()
        self._await_ready(self._slots[index])

    def close(self) -> None:
        for slot in self._slots:
            with contextlib.suppress(OSError, ValueError):
                slot.conn.send({"op": "stop"})
        for slot in self._slots:
            slot.process.join(timeout=5)
            self._kill(slot)

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests ---------------------------------------------------------------------------
    def _send(
        self, index: int, op: str, config: Config | None, timeout: float, **extra: Any
    ) -> None:
        slot = self._slots[index]
        slot.config, slot.deadline = config or _EAGER, time.monotonic() + timeout
        slot.conn.send({"op": op, "config": None if config is None else config.to_json(), **extra})

    def _collect(self, index: int, phase: str) -> dict[str, Any]:
        """The answer of worker ``index``, or a failure if it died; replaces a dead worker."""
        slot = self._slots[index]
        try:
            answer: dict[str, Any] = slot.conn.recv()
        except (EOFError, OSError):
            status = "compile_error" if phase == "build" else "runtime_error"
            answer = {"status": status, "error": f"{_death(slot.process)} during {phase}"}
            self._replace(index)
            return answer
        if self.job.device == "cuda" and answer["status"] == "runtime_error":
            self._replace(index)  # the CUDA context may be corrupt: never reuse it
        return answer

    def _expire(self, index: int, phase: str) -> dict[str, Any]:
        timeout = self.build_timeout if phase == "build" else self.run_timeout
        self._replace(index)
        return {"status": "timeout", "error": f"{phase} took longer than {timeout:g} s"}

    def _build_all(self, configs: list[Config]) -> dict[Config, dict[str, Any]]:
        """Builds ``configs`` in parallel across the workers; returns each one's answer."""
        pending = list(configs)
        answers: dict[Config, dict[str, Any]] = {}
        while pending or any(s.config is not None for s in self._slots):
            for i, slot in enumerate(self._slots):
                if slot.config is None and pending:
                    self._send(i, "build", pending.pop(0), self.build_timeout)
            busy = [i for i, s in enumerate(self._slots) if s.config is not None]
            soonest = min(self._slots[i].deadline for i in busy)
            ready = wait([self._slots[i].conn for i in busy], max(0.0, soonest - time.monotonic()))
            for i in busy:
                slot = self._slots[i]
                config = slot.config
                assert config is not None
                if slot.conn in ready:
                    answers[config] = self._collect(i, "build")
                    if answers[config]["status"] == "ok":
                        self._slots[i].built.add(config)
                elif time.monotonic() >= slot.deadline:
                    answers[config] = self._expire(i, "build")
                else:
                    continue
                self._slots[i].config = None
        return answers

    def _call(
        self, index: int, op: str, config: Config | None, timeout: float, **extra: Any
    ) -> dict[str, Any]:
        """One request to worker ``index``, waited for; a death or a timeout is the answer."""
        self._send(index, op, config, timeout, **extra)
        slot = self._slots[index]
        answer = (
            self._collect(index, op)
            if slot.conn.poll(max(0.0, slot.deadline - time.monotonic()))
            else self._expire(index, op)
        )
        self._slots[index].config = None
        return answer

    def _request(self, op: str, config: Config | None, **extra: Any) -> dict[str, Any]:
        """``op`` on the worker that built ``config``, within ``run_timeout``.

        If no live worker has it (its builder was replaced), it is built first, within
        ``build_timeout``. ``validate`` also builds the edge problem, so it gets both.
        """
        index = next((i for i, s in enumerate(self._slots) if config in s.built), None)
        if config is not None and index is None:
            index = 0
            answer = self._call(index, "build", config, self.build_timeout)
            if answer["status"] != "ok":
                return answer
            self._slots[index].built.add(config)
        timeout = self.run_timeout + (self.build_timeout if op == "validate" else 0.0)
        return self._call(index or 0, op, config, timeout, **extra)

    def measure(self, config: Config | None) -> dict[str, Any]:
        """Checks and times one config (``None``: the workload's torch eager function)."""
        return self._request("measure", config)

    def validate(self, config: Config, seeds: Sequence[int]) -> ValidationReport:
        """The full golden-reference validation of ``config``, run in a worker.

        A worker that dies or hangs while validating yields a failed report naming why.
        """
        answer = self._request("validate", config, seeds=list(seeds))
        if answer["status"] == "ok":
            return ValidationReport.model_validate(answer["report"])
        check = CheckModel(
            problem=dict(self.job.problem.items()),
            seed=seeds[0],
            rel_error=None,
            max_abs_error=None,
            tolerance=1.0,
            passed=False,
            note=f"{answer['status']}: {answer.get('error', '')}"[:500],
        )
        return ValidationReport(passed=False, tolerance=1.0, max_rel_error=None, checks=[check])

    def evaluate(self, configs: list[Config]) -> list[Trial]:
        """Builds ``configs`` in parallel, then checks and times each; one trial per config."""
        built = self._build_all(configs)
        trials = []
        for config in configs:
            answer = built[config]
            if answer["status"] == "ok":
                answer = self.measure(config)
            status = answer["status"]
            if status != "ok":
                self.failures[status] += 1
                logger.info("candidate %s: %s: %s", config, status, answer.get("error", ""))
            trials.append(
                Trial(
                    config=config.to_json(),
                    status=status,
                    time_ms=answer.get("time_ms") if status == "ok" else None,
                    error=str(answer.get("error", ""))[:2000],
                    times_ms=tuple(answer.get("times_ms", ())),
                )
            )
        return trials
