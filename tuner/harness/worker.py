"""The measurement worker: a process that builds, checks and times candidates on request.

It runs in its own process so that a candidate which segfaults, hangs or corrupts the device takes
only this worker down; the pool (:mod:`tuner.harness.pool`) notices, records the failure and
starts a replacement. One worker serves many tasks (keys): each request carries its task, which
the worker sets up once (:class:`~tuner.harness.measurer.Measurer`) and keeps while it is recent.
Requests and answers are plain dicts over a ``multiprocessing`` pipe:

* ``{"op": "setup", "task": {...}}`` → ``{"status": "ok"}`` once the task is set up (the pool
  sends it before a worker's first request for a task, under the start timeout)
* ``{"op": "build", "task": {...}, "config": {...}}`` → ``{"status": "ok"}`` or a
  :class:`~tuner.measure.Measurement` as JSON (``compile_error``)
* ``{"op": "measure", "task": {...}, "config": {...} | None, "cutoff_ms": float?}`` → a
  measurement as JSON; ``"config": null`` times the kernel's torch eager function (the baseline)
  the same way; a candidate slower than ``cutoff_ms`` is cut short
* ``{"op": "validate", "task": {...}, "config": {...}, "seeds": [...]}`` →
  ``{"status": "ok", "report": {...}}``: the full golden-reference validation, in the worker

A task that cannot be set up (an unknown kernel, a backend that fails to import) is answered
``{"status": "setup_error", "error": ...}``.
"""

from __future__ import annotations

import signal
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from tuner.harness.measurer import Measurer, describe

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

MAX_TASKS = 4  # set-ups kept per worker (inputs and references can be large)
MAX_CUDA_TASKS = 2  # on a GPU, where every worker's set-ups share one device's memory


class _Tasks:
    """The worker's recent set-ups, by task digest."""

    def __init__(self) -> None:
        self.measurers: OrderedDict[str, Measurer] = OrderedDict()

    def get(self, task_json: dict[str, Any]) -> Measurer:
        from tuner.harness.task import Task

        task = Task.from_json(task_json)
        key = task.digest()
        if key not in self.measurers:
            kept = MAX_CUDA_TASKS if task.device == "cuda" else MAX_TASKS
            while len(self.measurers) >= kept:
                self.measurers.popitem(last=False)
                _release(task.device)
            self.measurers[key] = Measurer(task)
        self.measurers.move_to_end(key)
        return self.measurers[key]


def _release(device: str) -> None:
    """Gives a dropped set-up's device memory back (other workers share the GPU)."""
    if device == "cuda":
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()


def _answer(tasks: _Tasks, request: dict[str, Any]) -> dict[str, Any]:
    op = request.get("op")
    try:
        measurer = tasks.get(request["task"])
    except Exception as exc:
        return {"status": "setup_error", "error": describe(exc)}
    if op == "setup":
        return {"status": "ok"}
    if op == "build":
        failed = measurer.try_build(request["config"])
        return {"status": "ok"} if failed is None else failed.to_json()
    if op == "measure":
        return measurer.measure(request["config"], request.get("cutoff_ms")).to_json()
    if op == "validate":
        report = measurer.validate(request["config"], request["seeds"])
        return {"status": "ok", "report": report.model_dump(mode="json")}
    return {"status": "invalid", "error": f"unknown request {op!r}"}


def worker_main(conn: Connection) -> None:
    """The worker process's loop: answer requests until told to stop."""
    # Ctrl-C reaches the whole process group: the parent stops the workers, which must not
    # print tracebacks of their own meanwhile.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tasks = _Tasks()
    conn.send({"status": "ready"})
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request.get("op") == "stop":
            return
        conn.send(_answer(tasks, request))
