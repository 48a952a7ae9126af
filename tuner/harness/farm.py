"""The compile farm: CPU-only processes that compile candidates ahead of the one that times them.

A backend that can compile for its device without the device (``Backend.compile_target``: Triton
for an ``sm_90``) has its candidates compiled here, on every core, while the harness's timing
process checks and times the ones already compiled. A farm process never sets a task up (no
inputs, no reference) and never sees the GPU (``CUDA_VISIBLE_DEVICES`` is empty there, and the
Triton interpreter is off); what it compiles lands in the compiler's cache on disk, where the
timing process loads it from.

The farm is asynchronous: :meth:`CompileFarm.submit` queues configs and hands them to idle
processes, :meth:`CompileFarm.service` takes the answers of those that finished (a process that
dies or outlives ``timeout`` is replaced; its config answered ``compile_error`` or ``timeout``),
and :meth:`CompileFarm.take` hands an answer over, in the order answers arrived.

Example:
    >>> farm = CompileFarm(workers=4, timeout=300.0, start_timeout=180.0)  # doctest: +SKIP
    >>> farm.submit(task, [config.to_json() for config in batch])  # doctest: +SKIP
"""

from __future__ import annotations

import multiprocessing.connection
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

from tunecache.canonical import canonical_json
from tunecache.settings import NO_DEVICE_ENV
from tuner.harness.messages import Answer, Request
from tuner.harness.processes import Slot, await_all, await_ready, death, kill, start_worker, stop
from tuner.harness.task import Task

# Imported by a farm process before it says it is ready, where installed. Before, its first
# compile paid them inside a key's first batch, whose pace a time-bounded search projects for the
# next: each process's first compile took 1.8-2.3 s against 0.6-0.7 s for its next ones on a
# 2-core AMD EPYC, 0.7-0.8 s since (bench/results/tuning_throughput-epyc*.md); on an H200 the
# first key of a process stopped its 25 s search at 9 of its 48 trials, twice. Measurement
# workers import what their backend needs as they set a task up, which is counted apart: a TVM
# worker loads no Triton (two LLVMs in one process).
PRELOAD = ("torch", "triton.compiler")


class CompileFarm:
    """Compile processes shared by every key of a harness.

    Args:
        workers: processes compiling in parallel.
        timeout: seconds one compile may take before its process is killed.
        start_timeout: seconds a process may take to start.
    """

    def __init__(self, *, workers: int, timeout: float, start_timeout: float) -> None:
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.started = 0
        self.replaced = 0
        self._queue: deque[tuple[Task, str, str, dict[str, Any]]] = deque()
        self._done: dict[tuple[str, str], Answer] = {}  # (task, label) → answer
        self._dropped: set[tuple[str, str]] = set()  # running, cancelled: answers not kept
        self._slots = [self._start() for _ in range(max(1, workers))]
        await_all(self._slots, start_timeout)

    @property
    def workers(self) -> int:
        return len(self._slots)

    def _start(self) -> Slot:
        self.started += 1
        return start_worker(NO_DEVICE_ENV, preload=PRELOAD)

    def _replace(self, index: int) -> None:
        kill(self._slots[index])
        self.replaced += 1
        self._slots[index] = self._start()
        await_ready(self._slots[index], self.start_timeout)

    def close(self) -> None:
        stop(self._slots)

    # -- the queue --------------------------------------------------------------------------
    def _known(self, task_id: str) -> set[str]:
        queued = {label for _, t, label, _ in self._queue if t == task_id}
        running = {s.config for s in self._slots if s.task == task_id and s.config is not None
                   and (task_id, s.config) not in self._dropped}  # fmt: skip
        return queued | running | {label for t, label in self._done if t == task_id}

    def submit(self, task: Task, configs: Iterable[Mapping[str, Any]]) -> None:
        """Queues ``configs`` of ``task`` (those not queued, compiling or compiled already) and
        starts what idle processes can take."""
        task_id = task.digest()
        known = self._known(task_id)
        for config in configs:
            label = canonical_json(dict(config))
            if label not in known:
                known.add(label)
                self._queue.append((task, task_id, label, dict(config)))
        self._dispatch()

    def cancel(self, task: Task) -> None:
        """Drops everything of ``task``: its queued configs, its answers not taken, and those of
        its compiles still running when they arrive (which still finish, into the cache)."""
        task_id = task.digest()
        self._queue = deque(q for q in self._queue if q[1] != task_id)
        self._done = {k: v for k, v in self._done.items() if k[0] != task_id}
        self._dropped |= {(task_id, s.config) for s in self._slots
                          if s.task == task_id and s.config is not None}  # fmt: skip

    def _dispatch(self) -> None:
        for slot in self._slots:
            if slot.config is None and self._queue:
                task, task_id, label, config = self._queue.popleft()
                slot.task, slot.config = task_id, label
                slot.deadline = time.monotonic() + self.timeout
                slot.conn.send(Request(op="compile", task=task.to_json(), config=config))

    # -- answers ----------------------------------------------------------------------------
    def busy(self) -> list[Connection]:
        """The pipes of processes compiling now (to wait on)."""
        return [s.conn for s in self._slots if s.config is not None]

    def deadline(self) -> float | None:
        """When the soonest compile running now times out, or ``None`` if none is running."""
        return min((s.deadline for s in self._slots if s.config is not None), default=None)

    def service(self, ready: Iterable[object] = ()) -> None:
        """Takes the answers on ``ready`` pipes, times out overdue compiles, starts queued ones."""
        ready = set(ready)
        for index, slot in enumerate(self._slots):
            if slot.config is None or slot.task is None:
                continue
            key = (slot.task, slot.config)
            if slot.conn in ready:
                try:
                    self._done[key] = slot.conn.recv()
                except (EOFError, OSError):
                    why = f"{death(slot.process)} during compile"
                    self._done[key] = Answer(status="compile_error", error=why)
                    self._replace(index)
            elif time.monotonic() >= slot.deadline:
                why = f"compile took longer than {self.timeout:g} s"
                self._done[key] = Answer(status="timeout", error=why)
                self._replace(index)
            else:
                continue
            self._slots[index].task = self._slots[index].config = None
            if key in self._dropped:
                self._dropped.discard(key)
                del self._done[key]
        self._dispatch()

    def wait(self, also: Sequence[Connection] = (), until: float | None = None) -> list[object]:
        """Waits for a compile to finish, one of ``also`` to be readable, ``until`` (a
        ``time.monotonic()``) or a compile's timeout, whichever comes first; services the farm
        and returns the readable pipes (``also``'s among them)."""
        deadlines = [d for d in (self.deadline(), until) if d is not None]
        timeout = None if not deadlines else max(0.0, min(deadlines) - time.monotonic())
        ready = multiprocessing.connection.wait([*self.busy(), *also], timeout)
        self.service(ready)
        return list(ready)

    def compile_all(self, task: Task, configs: Iterable[Mapping[str, Any]]) -> dict[str, Answer]:
        """Every config's answer, by label, waited for (those submitted already included)."""
        labels = {canonical_json(dict(c)): dict(c) for c in configs}
        answers: dict[str, Answer] = {}
        self.submit(task, labels.values())
        while waiting := [label for label in labels if label not in answers]:
            if (label := self.arrived(task, waiting)) is not None:
                answers[label] = self.take(task, label)
                continue
            if not self.busy():  # answered and taken before: compile again
                self.submit(task, [labels[label] for label in waiting])
            self.wait()
        return answers

    def arrived(self, task: Task, labels: Iterable[str]) -> str | None:
        """The first of ``labels`` whose answer arrived (in arrival order), or ``None``."""
        task_id, wanted = task.digest(), set(labels)
        return next((label for t, label in self._done if t == task_id and label in wanted), None)

    def take(self, task: Task, label: str) -> Answer:
        """The answer for ``label`` (which :meth:`arrived` named), handed over once."""
        return self._done.pop((task.digest(), label))
