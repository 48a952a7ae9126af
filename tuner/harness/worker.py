"""The measurement worker: a process that builds, checks and times candidates on request.

It runs in its own process so that a candidate which segfaults, hangs or corrupts the device takes
only this worker down; the pool (:mod:`tuner.harness.pool`) notices, records the failure and
starts a replacement. One worker serves many tasks (keys): each request carries its task, which
the worker sets up once (:class:`~tuner.harness.measurer.Measurer`) and keeps while it is recent.
Requests and answers are :mod:`tuner.harness.messages`; what each request does is said there.
"""

from __future__ import annotations

import importlib
import importlib.util
import signal
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tuner.harness.measurer import Measurer, describe
from tuner.harness.messages import READY, Answer, Request

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


def _compile(request: Request) -> Answer:
    """Compiles the request's config for its task's target (see :mod:`tuner.harness.messages`)."""
    from backends import CompilesAhead
    from tuner.harness.task import Task, resolve_backend
    from workloads import get_workload

    started = time.perf_counter()
    try:
        task = Task.from_json(dict(request.task or {}))
        backend = resolve_backend(task.backend)
        if task.target is None or request.config is None or not isinstance(backend, CompilesAhead):
            raise ValueError("a compile request needs a task with a target, a config and a "
                             "backend that compiles ahead")  # fmt: skip
        facts = backend.compile_ahead(
            get_workload(task.workload), task.problem, task.dtype, request.config, task.target
        )
    except Exception as exc:
        return Answer(status="compile_error", error=describe(exc))
    limit = task.target.limits.max_shared_memory_per_block
    if facts.get("shared", 0) > limit:
        why = (f"the compiled kernel uses {facts['shared']} bytes of shared memory; "
               f"{task.target.arch} allows {limit} per block (read from the compiled code; "
               "never launched)")  # fmt: skip
        return Answer(status="invalid", error=why)
    return Answer(status="ok", seconds=time.perf_counter() - started, facts=facts)


def _counting_compiles(measurer: Measurer, answer: Callable[[], Answer]) -> Answer:
    """``answer()``, with ``compiles``: how many the backend ran meanwhile, where it counts."""
    before = measurer.backend.compiles()
    result = answer()
    after = measurer.backend.compiles()
    if before is not None and after is not None:
        result = result.plus(compiles=after - before)
    return result


def _build(measurer: Measurer, config: dict[str, Any]) -> Answer:
    failed = measurer.try_build(config)
    return Answer(status="ok") if failed is None else Answer.of(failed)


def _answer(tasks: _Tasks, request: Request) -> Answer:
    if request.op == "compile":
        return _compile(request)
    try:
        measurer = tasks.get(dict(request.task or {}))
    except Exception as exc:
        return Answer(status="setup_error", error=describe(exc))
    config = None if request.config is None else dict(request.config)
    if request.op == "setup":
        return Answer(status="ok", check_s=measurer.check_s)
    if request.op == "build" and config is not None:
        return _counting_compiles(measurer, lambda: _build(measurer, config))
    if request.op == "measure":
        return _counting_compiles(measurer, lambda: Answer.of(
            measurer.measure(config, request.cutoff_ms, again=request.again)))  # fmt: skip
    if request.op == "validate" and config is not None:
        seeds = list(request.seeds)
        return _counting_compiles(
            measurer, lambda: Answer(status="ok", report=measurer.validate(config, seeds))
        )
    return Answer(status="invalid", error=f"cannot answer {request.op!r} with config {config}")


def _preload(names: Sequence[str]) -> str | None:
    """Imports ``names`` (those installed); returns why one failed, if one did (its first
    request's answer says it: a second import of a half-imported module may fail otherwise)."""
    for name in names:
        if importlib.util.find_spec(name.partition(".")[0]) is None:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:
            return f"importing {name} at start failed: {describe(exc)}"
    return None


def worker_main(conn: Connection, env: Mapping[str, str | None] | None = None,
                cores: list[int] | None = None, preload: Sequence[str] = ()) -> None:  # fmt: skip
    """The worker process's loop: answer requests until told to stop.

    ``env`` changes the process's environment first, before anything is imported (``None``
    removes a variable): the compile farm's processes run without the Triton interpreter.
    ``cores``: a measurement worker's, pinned to them with as many threads
    (:mod:`tuner.harness.discipline`). ``preload``: modules imported before the worker says it
    is ready (see :mod:`tuner.harness.farm`).
    """
    from tunecache.settings import apply_environment

    apply_environment(env or {})
    if cores:
        from tuner.harness.discipline import settle

        settle(cores)
    # Ctrl-C reaches the whole process group: the parent stops the workers, which must not
    # print tracebacks of their own meanwhile.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    failed = _preload(preload)
    tasks = _Tasks()
    conn.send(READY)
    while True:
        try:
            request: Request = conn.recv()
        except EOFError:
            return
        if request.op == "stop":
            return
        answer = _answer(tasks, request)
        if failed is not None and not answer.ok:
            answer = answer.plus(error=f"{answer.error} ({failed})" if answer.error else failed)
        conn.send(answer)
