"""A pool of measurement workers that survives whatever a candidate does, reused across keys.

A :class:`Harness` owns worker processes; :meth:`Harness.benchmarker` binds it to one key's
:class:`Task` as a :class:`~tuner.measure.Benchmarker`. Its :meth:`~HarnessBenchmarker.evaluate`
takes a batch of configs and

1. builds them in parallel, one per worker process (compilation is CPU work), then
2. checks and times them one at a time (measurements must not share the device),

recording a candidate that raises, segfaults, or outlives its timeout as failed — ``compile_error``,
``runtime_error``, ``timeout`` or ``wrong_answer`` — replacing its worker, and going on. A wrong
answer never gets a time, so it can never win. The daemon keeps one harness for every key it tunes:
workers start once (:attr:`Harness.started` counts them).

A task with a compile ``target`` (Triton on a GPU) goes another way: its candidates compile in
the :class:`~tuner.harness.farm.CompileFarm`, on every core and without the GPU, and one worker
(``TIMER``, the only one that sets the task up and touches the device) checks and times each as
it arrives, loading it from the compiler's cache; the search's next batch compiles meanwhile
(:meth:`FarmBenchmarker.prefetch`). :attr:`HarnessBenchmarker.timer_compiles` counts what the
timing processes compiled all the same.

Example:
    >>> with Harness(workers=2) as harness:  # doctest: +SKIP
    ...     trials = harness.benchmarker(task).evaluate(list(space.configs())[:8])
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from multiprocessing.connection import wait
from typing import Any

from tunecache.canonical import canonical_json
from tunecache.errors import TuningError
from tunecache.schemas import Trial, ValidationReport
from tunecache.space import Config
from tuner.harness.discipline import reserved_cores, worker_environment
from tuner.harness.farm import CompileFarm
from tuner.harness.messages import Answer, AnswerStatus, Op, Request, failed_report
from tuner.harness.processes import Slot, await_all, await_ready, death, kill, start_worker, stop
from tuner.harness.task import Task
from tuner.measure import Benchmarker, Measurement

logger = logging.getLogger(__name__)
_EAGER = "torch_eager"  # marks a request that times torch eager (or sets a task up)
TIMER = 0  # the worker that times a farm-compiled task's candidates (the only one set up)
ConfigJSON = Mapping[str, Any]


def _label(config: ConfigJSON | None) -> str:
    """A config's identity in the pool: its canonical JSON."""
    return _EAGER if config is None else canonical_json(dict(config))


class Harness:
    """Isolated worker processes that measure candidates of any number of keys.

    Args:
        workers: worker processes (parallel builds); defaults to the CPU count.
        build_timeout: seconds one build may take before its worker is killed.
        run_timeout: seconds one check-and-time may take before its worker is killed.
        start_timeout: seconds a worker may take to start or to set a task up (import
            frameworks, make inputs and the reference).
    """

    def __init__(
        self,
        *,
        workers: int | None = None,
        build_timeout: float = 300.0,
        run_timeout: float = 60.0,
        start_timeout: float = 180.0,
    ) -> None:
        self.build_timeout = build_timeout
        self.run_timeout = run_timeout
        self.start_timeout = start_timeout
        self.failures: Counter[str] = Counter()
        self.started = 0  # worker processes started, replacements included
        self.replaced = 0
        self._farm: CompileFarm | None = None
        # seconds spent setting keys up: on every worker at once, or on the timing process
        self.setup_s = 0.0
        # by task: the quickest set-up's inputs and reference (set-ups at once slow each other;
        # a validation's checks run alone)
        self.check_s: dict[str, float] = {}
        self.cores = reserved_cores()  # measurement workers are pinned to these (None: not)
        count = max(1, workers or os.cpu_count() or 1)
        self._slots = [self._start() for _ in range(count)]
        await_all(self._slots, self.start_timeout)

    @property
    def workers(self) -> int:
        """How many worker processes build in parallel."""
        return len(self._slots)

    def benchmarker(self, task: Task) -> HarnessBenchmarker:
        """This harness measuring the candidates of ``task`` (those of a task with a compile
        ``target`` compiled in the farm: a :class:`FarmBenchmarker`)."""
        kind = HarnessBenchmarker if task.target is None else FarmBenchmarker
        return kind(self, task)

    # -- worker lifecycle -----------------------------------------------------------------
    def _start(self) -> Slot:
        self.started += 1
        return start_worker(worker_environment(self.cores), self.cores)

    def _replace(self, index: int) -> None:
        kill(self._slots[index])
        self.replaced += 1
        self._slots[index] = self._start()
        await_ready(self._slots[index], self.start_timeout)

    @property
    def farm(self) -> CompileFarm:
        """The compile farm, started on first use (as many processes as workers)."""
        if self._farm is None:
            self._farm = CompileFarm(workers=self.workers, timeout=self.build_timeout,
                                     start_timeout=self.start_timeout)  # fmt: skip
        return self._farm

    def restart(self, *, busy_only: bool = False) -> None:
        """Workers started afresh at once (``busy_only``: those with a request in flight; else
        all, and the farm when next used): an answer left unread is not taken for the next's."""
        chosen = [i for i, s in enumerate(self._slots) if not busy_only or s.config is not None]
        for i in chosen:
            kill(self._slots[i])
            self._slots[i] = self._start()
        self.replaced += len(chosen)
        await_all([self._slots[i] for i in chosen], self.start_timeout)
        if self._farm is not None and not busy_only:
            self._farm.close()
            self._farm = None

    def close(self) -> None:
        stop(self._slots)
        if self._farm is not None:
            self._farm.close()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests ---------------------------------------------------------------------------
    def _set_up(self, index: int, task: Task, task_id: str) -> None:
        """Makes worker ``index`` set ``task`` up, once, within ``start_timeout``.

        Raises:
            TuningError: the task cannot be set up (its kernel or backend fails to load).
        """
        if task_id in self._slots[index].tasks:
            return
        answer = self._call(index, task, Request(op="setup"), None, self.start_timeout)
        if not answer.ok:
            raise TuningError(f"a measurement worker could not set up: {answer.error}")
        self._slots[index].tasks.add(task_id)

    def _set_up_all(self, task: Task, task_id: str) -> None:
        """Sets ``task`` up on every worker that lacks it, all at once (a set-up makes inputs
        and the reference: seconds each at large shapes, so never one worker after another).

        Raises:
            TuningError: the task cannot be set up.
        """
        waiting = [i for i, s in enumerate(self._slots) if task_id not in s.tasks]
        if not waiting:
            return
        failure, started = None, time.monotonic()
        for i in waiting:
            self._send(i, task, Request(op="setup"), None, self.start_timeout)
        for i in waiting:
            slot = self._slots[i]
            if slot.conn.poll(max(0.0, slot.deadline - time.monotonic())):
                answer = self._collect(i, "setup", task)
            else:
                answer = self._expire(i, "setup")
            self._slots[i].config = None
            if answer.ok:
                self._slots[i].tasks.add(task_id)
            else:
                failure = failure or answer.error
        self.setup_s += time.monotonic() - started
        if failure is not None:
            raise TuningError(f"a measurement worker could not set up: {failure}")

    def _send(self, index: int, task: Task, request: Request, config: ConfigJSON | None,
              timeout: float) -> None:  # fmt: skip
        slot = self._slots[index]
        slot.config, slot.deadline = _label(config), time.monotonic() + timeout
        slot.conn.send(request.bound(task.to_json(), config))

    def _collect(self, index: int, phase: Op, task: Task) -> Answer:
        """The answer of worker ``index``, or a failure if it died; replaces a dead worker."""
        slot = self._slots[index]
        try:
            answer: Answer = slot.conn.recv()
        except (EOFError, OSError):
            status: AnswerStatus = "compile_error" if phase == "build" else "runtime_error"
            answer = Answer(status=status, error=f"{death(slot.process)} during {phase}")
            self._replace(index)
            return answer
        if answer.check_s is not None:
            digest = task.digest()
            self.check_s[digest] = min(answer.check_s, self.check_s.get(digest, answer.check_s))
        if task.device == "cuda" and answer.status == "runtime_error":
            self._replace(index)  # the CUDA context may be corrupt: never reuse it
        return answer

    def _expire(self, index: int, phase: Op) -> Answer:
        timeout = self.build_timeout if phase == "build" else self.run_timeout
        self._replace(index)
        return Answer(status="timeout", error=f"{phase} took longer than {timeout:g} s")

    def _call(self, index: int, task: Task, request: Request, config: ConfigJSON | None,
              timeout: float) -> Answer:  # fmt: skip
        """One request to worker ``index``, waited for; a death or a timeout is the answer."""
        self._send(index, task, request, config, timeout)
        slot = self._slots[index]
        phase = request.op
        if slot.conn.poll(max(0.0, slot.deadline - time.monotonic())):
            answer = self._collect(index, phase, task)
        else:
            answer = self._expire(index, phase)
        self._slots[index].config = None
        return answer

    def build_all(self, task: Task, configs: list[Config]) -> dict[str, Answer]:
        """Builds ``configs`` in parallel across the workers; each one's answer by its label."""
        task_id = task.digest()
        pending: list[ConfigJSON] = list(configs)
        answers: dict[str, Answer] = {}
        if pending:
            self._set_up_all(task, task_id)
        while pending or any(s.config is not None for s in self._slots):
            for i, slot in enumerate(self._slots):
                if slot.config is None and pending:
                    self._set_up(i, task, task_id)
                    self._send(i, task, Request(op="build"), pending.pop(0), self.build_timeout)
            busy = [i for i, s in enumerate(self._slots) if s.config is not None]
            soonest = min(self._slots[i].deadline for i in busy)
            ready = wait([self._slots[i].conn for i in busy], max(0.0, soonest - time.monotonic()))
            for i in busy:
                slot = self._slots[i]
                config = slot.config
                assert config is not None
                if slot.conn in ready:
                    answers[config] = self._collect(i, "build", task)
                    if answers[config].ok:
                        self._slots[i].built.add((task_id, config))
                elif time.monotonic() >= slot.deadline:
                    answers[config] = self._expire(i, "build")
                else:
                    continue
                self._slots[i].config = None
        return answers

    def measure_compiled(
        self, task: Task, configs: Sequence[ConfigJSON], cutoff: Callable[[], float | None]
    ) -> Iterator[tuple[str, Answer]]:
        """Checks and times the farm-compiled ``configs`` of ``task`` on the timing worker, each
        as soon as the farm has compiled it (submitting those not submitted yet), with the
        ``cutoff()`` of the moment; yields ``(label, answer)`` in the order they finish.

        A config that did not compile is answered by the farm (``compile_error``, ``invalid``,
        ``timeout``); one timed is answered by the timing worker, with ``compile_s`` (its
        farm compile's seconds) and ``measure_s`` (the check and timing's wall time) added.
        """
        farm, task_id = self.farm, task.digest()
        by_label = {_label(c): dict(c) for c in configs}
        farm.submit(task, by_label.values())
        waiting, compile_s, sent = list(by_label), 0.0, 0.0
        doing: Op | None = None  # the timing worker's request in flight: setup or measure
        while waiting or doing is not None:
            timer = self._slots[TIMER]
            if doing is None and task_id not in timer.tasks:  # overlaps the farm's compiles
                self._send(TIMER, task, Request(op="setup"), None, self.start_timeout)
                doing, sent = "setup", time.monotonic()
                continue
            if doing is None and (label := farm.arrived(task, waiting)) is not None:
                waiting.remove(label)
                compiled = farm.take(task, label)
                if not compiled.ok:
                    yield label, compiled
                    continue
                compile_s, sent = compiled.seconds, time.monotonic()
                self._send(TIMER, task, Request(op="measure", cutoff_ms=cutoff()),
                           by_label[label], self.run_timeout)  # fmt: skip
                doing = "measure"
                continue
            if doing is None and not farm.busy():  # compiled and taken before: compile again
                farm.submit(task, [by_label[label] for label in waiting])
            ready = farm.wait([timer.conn], timer.deadline) if doing else farm.wait()
            if doing is None:
                continue
            label = timer.config
            if timer.conn in ready:
                answer = self._collect(TIMER, doing, task)
            elif time.monotonic() >= timer.deadline:
                answer = self._expire(TIMER, doing)
            else:
                continue
            self._slots[TIMER].config = None
            if doing == "setup":
                doing, self.setup_s = None, self.setup_s + time.monotonic() - sent
                if not answer.ok:
                    raise TuningError(f"a measurement worker could not set up: {answer.error}")
                self._slots[TIMER].tasks.add(task_id)
                continue
            doing = None
            assert label is not None
            if answer.ok:
                self._slots[TIMER].built.add((task_id, label))
            yield label, answer.plus(compile_s=compile_s, measure_s=time.monotonic() - sent)

    def timer_has(self, task: Task, config: ConfigJSON) -> bool:
        """Whether the timing worker has loaded ``config`` of ``task`` already."""
        return (task.digest(), _label(config)) in self._slots[TIMER].built

    def request(self, task: Task, request: Request, config: ConfigJSON | None, *,
                worker: int | None = None) -> Answer:  # fmt: skip
        """``request`` (a measurement or a validation) on the worker that built ``config`` for
        ``task`` (on ``worker`` when given), within ``run_timeout``.

        If that worker lacks it (no live worker has it: its builder was replaced), it is built
        there first, within ``build_timeout``. ``validate`` also builds the edge problem, so it
        gets both.
        """
        task_id, label = task.digest(), _label(config)
        built_by = next((i for i, s in enumerate(self._slots) if (task_id, label) in s.built), 0)
        index = built_by if worker is None else worker
        compiles = 0
        if (task_id, label) not in self._slots[index].built:
            self._set_up(index, task, task_id)
            if config is not None:
                answer = self._call(index, task, Request(op="build"), config, self.build_timeout)
                if not answer.ok:
                    return answer
                compiles = answer.compiles
                self._slots[index].built.add((task_id, label))
        timeout = self.run_timeout + (self.build_timeout if request.op == "validate" else 0.0)
        answer = self._call(index, task, request, config, timeout)
        return answer.plus(compiles=answer.compiles + compiles) if compiles else answer


CUT_SLOWER_THAN = 3.0  # a searched candidate this many times slower than the best is cut short


class HarnessBenchmarker(Benchmarker):
    """A :class:`Harness` measuring the candidates of one :class:`Task`."""

    def __init__(self, harness: Harness, task: Task) -> None:
        self.harness = harness
        self.task = task
        self._task_id = task.digest()
        self._build_s: list[float] = []  # one build's seconds, per batch
        self._measure_s: list[float] = []
        self.best_ms: float | None = None  # the fastest searched candidate so far
        self.timer_compiles = 0  # compiles run in the processes that time (not the farm's)
        self._set_up_s: float | None = None  # the first batch's one-time seconds (None: no batch)

    @property
    def parallelism(self) -> int:
        return self.harness.workers

    def _cutoff(self) -> float | None:
        return None if self.best_ms is None else CUT_SLOWER_THAN * self.best_ms

    def _count(self, answer: Answer) -> None:
        self.timer_compiles += answer.compiles

    def seconds_per_measure(self) -> float:
        return sum(self._measure_s) / len(self._measure_s) if self._measure_s else 0.0

    def seconds_setting_up(self) -> float:
        return self._set_up_s or 0.0

    def _once(self, seconds: float) -> float:
        """``seconds`` of one-time work, counted if this is the key's first batch; else 0 (a
        worker set up again after a crash is what the batches that crash cost)."""
        if self._set_up_s is not None:
            return 0.0
        self._set_up_s = max(0.0, seconds)
        return self._set_up_s

    def seconds_per_build(self) -> float:
        return sum(self._build_s) / len(self._build_s) if self._build_s else 0.0

    def seconds_per_check(self) -> float:
        return self.harness.check_s.get(self._task_id, 0.0)

    def measure(self, config: ConfigJSON | None, cutoff_ms: float | None = None, *,
                again: bool = False) -> Measurement:  # fmt: skip
        """Checks and times ``config`` at length (re-timings, baselines) or, with
        ``cutoff_ms``, cut short when it is slower than that; ``again``: see
        :meth:`Benchmarker.measure`."""
        started = time.monotonic()
        answer = self._measured(config, cutoff_ms, again)
        self._measure_s.append(time.monotonic() - started)
        self._count(answer)
        return answer.as_measurement()

    def _measured(self, config: ConfigJSON | None, cutoff_ms: float | None, again: bool) -> Answer:
        # At length (a re-timing, a round of a comparison): all in one process, whose state
        # (where its buffers and threads landed) then falls on every contender alike.
        where = TIMER if cutoff_ms is None else None
        asked = Request(op="measure", cutoff_ms=cutoff_ms, again=again)
        return self.harness.request(self.task, asked, config, worker=where)

    def validate(self, config: ConfigJSON, seeds: Sequence[int]) -> ValidationReport:
        answer = self.harness.request(self.task, Request(op="validate", seeds=tuple(seeds)), config)
        self._count(answer)
        if answer.ok and answer.report is not None:
            return answer.report
        return failed_report(self.task.problem, seeds, f"{answer.status}: {answer.error}")

    def evaluate(self, configs: list[Config]) -> list[Trial]:
        started, setting_up = time.monotonic(), self.harness.setup_s
        built = self.harness.build_all(self.task, configs)
        if configs:  # builds run in parallel: each worker built about this many, one at a time
            rounds = -(-len(configs) // self.harness.workers)
            once = self._once(self.harness.setup_s - setting_up)  # not a build's seconds
            self._build_s.append(max(0.0, time.monotonic() - started - once) / rounds)
        trials = []
        for config in configs:
            answer = built[_label(config)]
            self._count(answer)
            measured = self.measure(config, self._cutoff()) if answer.ok else None
            trials.append(self._note(config, measured or answer.as_measurement()))
        return trials

    def _note(self, config: ConfigJSON, measured: Measurement) -> Trial:
        """``measured`` as ``config``'s trial, counted (failures) or kept (the best time)."""
        if not measured.ok:
            self.harness.failures[measured.status] += 1
            logger.info("candidate %s: %s: %s", config, measured.status, measured.error)
        elif measured.time_ms is not None:
            self.best_ms = min(self.best_ms or measured.time_ms, measured.time_ms)
        return measured.trial(config)


class FarmBenchmarker(HarnessBenchmarker):
    """A :class:`Harness` measuring the candidates of a task with a compile ``target``: they
    compile in the farm, ahead of the one process that times them, which it tells what comes
    next (:class:`~tuner.measure.Pipelines`)."""

    def __init__(self, harness: Harness, task: Task) -> None:
        super().__init__(harness, task)
        self._edge = task.at_edge()  # the validation's problem: compiled in the farm too

    def prefetch(self, configs: list[Config]) -> None:
        """Starts compiling ``configs``, the search's next batch, in the farm while the current
        batch is timed; ``[]`` drops what is still queued (the search stopped)."""
        if configs:
            self.harness.farm.submit(self.task, configs)
        else:
            self.harness.farm.cancel(self.task)

    def expect_validation(self, configs: Sequence[ConfigJSON]) -> None:
        """Starts compiling ``configs`` at the edge problem in the farm, for their validation."""
        if self._edge is not None:
            self.harness.farm.submit(self._edge, configs)

    def _measured(self, config: ConfigJSON | None, cutoff_ms: float | None, again: bool) -> Answer:
        if config is not None and not self.harness.timer_has(self.task, config):
            [(_, answer)] = self.harness.measure_compiled(self.task, [config], lambda: cutoff_ms)
            return answer
        return super()._measured(config, cutoff_ms, again)

    def validate(self, config: ConfigJSON, seeds: Sequence[int]) -> ValidationReport:
        if self._edge is not None:
            self.harness.farm.compile_all(self._edge, [config])  # failing shows in validation
        return super().validate(config, seeds)

    def evaluate(self, configs: list[Config]) -> list[Trial]:
        """Times each config as soon as the farm has compiled it. In the key's first batch,
        the timing process's set-up, as far as the batch waited for it before its first timing,
        is one-time work (not the farm's compiles: they may be its pace)."""
        found: dict[str, Trial] = {}
        started, waited, setting_up = time.monotonic(), None, self.harness.setup_s
        answers = self.harness.measure_compiled(self.task, configs, self._cutoff)
        for label, answer in answers:
            if waited is None and answer.measure_s is not None:
                waited = time.monotonic() - started - answer.measure_s
            if answer.compile_s is not None and answer.measure_s is not None:
                self._build_s.append(answer.compile_s)
                self._measure_s.append(answer.measure_s)
            self._count(answer)
            found[label] = self._note(json.loads(label), answer.as_measurement())
        if configs:
            set_up = self.harness.setup_s - setting_up
            self._once(set_up if waited is None else min(waited, set_up))
        return [found[_label(c)] for c in configs]
