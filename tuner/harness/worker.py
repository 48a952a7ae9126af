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
  the same way; a candidate slower than ``cutoff_ms`` is cut short; with ``"again": true`` a
  noisy timing is taken once more
* ``{"op": "validate", "task": {...}, "config": {...}, "seeds": [...]}`` →
  ``{"status": "ok", "report": {...}}``: the full golden-reference validation, in the worker
* ``{"op": "compile", "task": {...}, "config": {...}}`` → ``{"status": "ok", "seconds": s,
  "shared": bytes, ...}``: the compile farm's request, which needs no set-up (no inputs, no
  reference, no device): the config compiled for the task's ``target``; ``invalid`` when the
  compiled kernel needs more shared memory than the target allows, ``compile_error`` when it
  does not compile

A build, measurement or validation answer carries ``"compiles"``: the compiles the backend ran
in this process while answering (where it counts them), which the compile farm keeps at zero.

A task that cannot be set up (an unknown kernel, a backend that fails to import) is answered
``{"status": "setup_error", "error": ...}``.
"""

from __future__ import annotations

import signal
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
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


def _compile(request: dict[str, Any]) -> dict[str, Any]:
    """Compiles the request's config for its task's target (see the module's docstring)."""
    from tuner.harness.task import Task, resolve_backend
    from workloads import get_workload

    started = time.perf_counter()
    try:
        task = Task.from_json(request["task"])
        if task.target is None:
            raise ValueError("a compile request needs a task with a target")
        facts = resolve_backend(task.backend).compile_ahead(
            get_workload(task.workload), task.problem, task.dtype, request["config"], task.target
        )
    except Exception as exc:
        return {"status": "compile_error", "error": describe(exc)}
    limit = task.target.limits.max_shared_memory_per_block
    if facts.get("shared", 0) > limit:
        why = (f"the compiled kernel uses {facts['shared']} bytes of shared memory; "
               f"{task.target.arch} allows {limit} per block (read from the compiled code; "
               "never launched)")  # fmt: skip
        return {"status": "invalid", "error": why}
    return {"status": "ok", "seconds": time.perf_counter() - started, **facts}


def _counting_compiles(measurer: Measurer, answer: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``answer()``, with ``"compiles"``: how many the backend ran meanwhile, where it counts."""
    before = measurer.backend.compiles()
    result = answer()
    after = measurer.backend.compiles()
    if before is not None and after is not None:
        result["compiles"] = after - before
    return result


def _build(measurer: Measurer, config: dict[str, Any]) -> dict[str, Any]:
    failed = measurer.try_build(config)
    return {"status": "ok"} if failed is None else failed.to_json()


def _validate(measurer: Measurer, config: dict[str, Any], seeds: list[int]) -> dict[str, Any]:
    report = measurer.validate(config, seeds)
    return {"status": "ok", "report": report.model_dump(mode="json")}


def _answer(tasks: _Tasks, request: dict[str, Any]) -> dict[str, Any]:
    op = request.get("op")
    if op == "compile":
        return _compile(request)
    try:
        measurer = tasks.get(request["task"])
    except Exception as exc:
        return {"status": "setup_error", "error": describe(exc)}
    if op == "setup":
        return {"status": "ok"}
    if op == "build":
        return _counting_compiles(measurer, lambda: _build(measurer, request["config"]))
    if op == "measure":
        config, cutoff, again = request["config"], request.get("cutoff_ms"), request.get("again")
        return _counting_compiles(
            measurer, lambda: measurer.measure(config, cutoff, again=bool(again)).to_json()
        )
    if op == "validate":
        config, seeds = request["config"], request["seeds"]
        return _counting_compiles(measurer, lambda: _validate(measurer, config, seeds))
    return {"status": "invalid", "error": f"unknown request {op!r}"}


def worker_main(conn: Connection, env: Mapping[str, str | None] | None = None,
                cores: list[int] | None = None) -> None:  # fmt: skip
    """The worker process's loop: answer requests until told to stop.

    ``env`` changes the process's environment first, before anything is imported (``None``
    removes a variable): the compile farm's processes run without the Triton interpreter.
    ``cores``: a measurement worker's, pinned to them with as many threads
    (:mod:`tuner.harness.discipline`).
    """
    from tunecache.settings import apply_environment

    apply_environment(env or {})
    if cores:
        from tuner.harness.discipline import settle

        settle(cores)
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
