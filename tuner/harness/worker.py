"""The measurement worker: a process that builds, checks and times candidates on request.

It runs in its own process so that a candidate which segfaults, hangs or corrupts the device takes
only this worker down; the pool (:mod:`tuner.harness.pool`) notices, records the failure and
starts a replacement. Requests and answers are plain dicts over a ``multiprocessing`` pipe:

* ``{"op": "build", "config": {...}}`` → ``{"status": "ok" | "compile_error", "error", "seconds"}``
* ``{"op": "measure", "config": {...}}`` → ``{"status": "ok" | "wrong_answer" | "runtime_error" |
  "compile_error", "time_ms", "times_ms", "rel_error", "error"}``; ``"config": null`` times the
  workload's torch eager function (the baseline) the same way
* ``{"op": "validate", "config": {...}, "seeds": [...]}`` → ``{"status": "ok", "report": {...}}``:
  the full golden-reference validation (several seeds and the edge problem), in the worker

A candidate is checked against the float64 reference on fresh random inputs, with its output
buffer poisoned (NaN) beforehand where the runnable takes one, before its time counts.
"""

from __future__ import annotations

import contextlib
import logging
import time
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tunecache.canonical import canonical_json

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from backends import Runnable
    from tuner.harness.job import Job

logger = logging.getLogger(__name__)
MAX_CACHED = 64  # built candidates kept per worker


class _Worker:
    def __init__(self, job: Job) -> None:
        from tuner.harness.job import resolve_backend
        from workloads import get_workload

        self.job = job
        self.backend = resolve_backend(job.backend)
        self.workload = get_workload(job.workload)
        self.built: dict[str, Runnable] = {}
        inputs = self.workload.make_inputs(job.problem, job.dtype, job.seed)
        self.reference = self.workload.reference(*inputs)
        self.inputs = tuple(t.to(job.device) for t in inputs)
        self.tolerance = self.workload.tolerance(job.dtype)

    def build(self, config: dict[str, Any]) -> Runnable:
        key = canonical_json(config)
        if key not in self.built:
            if len(self.built) >= MAX_CACHED:
                self.built.pop(next(iter(self.built)))
            self.built[key] = self.backend.build(
                self.workload, self.job.problem, self.job.dtype, config
            )
        return self.built[key]

    def handle_build(self, config: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            self.build(config)
        except Exception as exc:
            return {"status": "compile_error", "error": _describe(exc)}
        return {"status": "ok", "seconds": time.perf_counter() - started}

    def handle_validate(self, config: dict[str, Any], seeds: list[int]) -> dict[str, Any]:
        from tuner.validation import validate

        def build(problem: Any) -> Runnable:
            if dict(problem) == self.job.problem:
                return self.build(config)
            return self.backend.build(self.workload, problem, self.job.dtype, config)

        runnable_device = self.job.device

        def on_device(problem: Any) -> Runnable:
            runnable = build(problem)
            if runnable_device == "cpu":
                return runnable

            def run(*inputs: Any) -> Any:
                return runnable(*(t.to(runnable_device) for t in inputs)).cpu()

            return run

        report = validate(on_device, self.workload, self.job.problem, self.job.dtype, seeds=seeds)
        return {"status": "ok", "report": report.model_dump(mode="json")}

    def handle_measure(self, config: dict[str, Any] | None) -> dict[str, Any]:
        from tuner.validation import compare

        try:
            runnable = self.workload.torch_fn if config is None else self.build(config)
        except Exception as exc:
            return {"status": "compile_error", "error": _describe(exc)}
        try:
            out = runnable(*self.inputs)
            _synchronize(self.job.device)
            with _one_torch_thread():
                rel, _max_abs, note = compare(out.cpu(), self.reference)
        except Exception as exc:
            return {"status": "runtime_error", "error": _describe(exc)}
        if rel is None or rel > self.tolerance:
            detail = note or f"relative error {rel:.3g} > tolerance {self.tolerance:g}"
            return {"status": "wrong_answer", "rel_error": rel, "error": detail}
        try:
            timing = _time(runnable, self.inputs, self.job)
        except Exception as exc:
            return {"status": "runtime_error", "error": _describe(exc)}
        return {
            "status": "ok",
            "time_ms": timing.median_ms,
            "times_ms": [timing.min_ms, timing.median_ms, timing.max_ms],
            "timing": timing.model_dump(mode="json"),
            "rel_error": rel,
        }


def _time(runnable: Runnable, inputs: tuple[Any, ...], job: Job) -> Any:
    if job.device == "cuda":
        from tunecache.timing import time_cuda

        return time_cuda(lambda: runnable(*inputs), job.timer)
    from tunecache.timing import time_cpu

    return time_cpu(lambda: runnable(*inputs), job.timer)


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[None]:
    """Runs torch single-threaded inside the block.

    After a parallel torch op, its idle OpenMP threads keep spinning for a while and steal the
    cores from the candidate timed next (seen here: a 3 ms TVM kernel measured 40 ms).
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _describe(exc: BaseException) -> str:
    frames = traceback.format_exception_only(type(exc), exc)
    return "".join(frames).strip()[:2000]


def worker_main(conn: Connection, job_json: dict[str, Any]) -> None:
    """The worker process's loop: set up once, then answer requests until told to stop."""
    from tuner.harness.job import Job

    try:
        worker = _Worker(Job.from_json(job_json))
    except Exception as exc:
        conn.send({"status": "setup_error", "error": _describe(exc)})
        return
    conn.send({"status": "ready"})
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        op = request.get("op")
        if op == "stop":
            return
        if op == "build":
            conn.send(worker.handle_build(request["config"]))
        elif op == "measure":
            conn.send(worker.handle_measure(request["config"]))
        elif op == "validate":
            conn.send(worker.handle_validate(request["config"], request["seeds"]))
        else:
            conn.send({"status": "invalid", "error": f"unknown request {op!r}"})
