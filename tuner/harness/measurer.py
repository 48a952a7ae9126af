"""Builds, checks and times the candidates of one :class:`Task`, in whatever process it runs in.

The worker processes of the harness run one :class:`Measurer` per task they serve; the in-process
benchmarker runs one here. A candidate is checked against the float64 reference on fresh random
inputs, its output buffer poisoned with NaN beforehand where the runnable writes into one (so an
element it never writes fails), before its time counts.
"""

from __future__ import annotations

import contextlib
import importlib
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tunecache.canonical import canonical_json
from tunecache.schemas import TimingModel, ValidationReport
from tuner.harness.task import Task, resolve_backend
from tuner.measure import Measurement

if TYPE_CHECKING:
    from backends import Runnable

MAX_CACHED = 64  # built candidates kept per task
MAX_ATTEMPTS = 2  # times a noisy timing is taken, in all (tunecache.conditions)


def describe(exc: BaseException) -> str:
    """The exception in one or a few lines (no traceback), at most 2000 characters."""
    frames = traceback.format_exception_only(type(exc), exc)
    return "".join(frames).strip()[:2000]


class Measurer:
    """The set-up of one task (backend, kernel, inputs, reference) and its built candidates."""

    def __init__(self, task: Task) -> None:
        from workloads import get_workload

        self.task = task
        self.backend = resolve_backend(task.backend)
        self.workload = get_workload(task.workload)
        import torch  # a fresh worker's first set-up imports it (a second): not a check's cost

        from tuner.validation import reference_on

        if task.device != "cpu":
            torch.empty(0, device=task.device)  # nor the device's start
        started = time.monotonic()
        inputs = self.workload.make_inputs(task.problem, task.dtype, task.seed)
        self.reference = reference_on(self.workload, inputs, task.device)
        # what each check of a validation does again: seconds for a large problem on a CPU
        self.check_s = time.monotonic() - started
        self.inputs = tuple(t.to(task.device) for t in inputs)
        self.tolerance = self.workload.tolerance(task.dtype)
        self.built: dict[str, Runnable] = {}

    def build(self, config: Mapping[str, Any]) -> Runnable:
        config = dict(config)  # a backend is handed plain JSON, in a worker process or not
        key = canonical_json(config)
        if key not in self.built:
            if len(self.built) >= MAX_CACHED:
                self.built.pop(next(iter(self.built)))
            self.built[key] = self.backend.build(
                self.workload, self.task.problem, self.task.dtype, config
            )
        return self.built[key]

    def try_build(self, config: Mapping[str, Any]) -> Measurement | None:
        """``None`` when ``config`` builds, else a ``compile_error`` measurement.

        A runnable that compiles on its first call (``compiles_on_first_call``: a Triton kernel
        on a GPU) is called once here, so that its compile runs in this parallel phase rather
        than in the serial timing that follows; a launch that fails is a ``runtime_error``
        (``invalid`` when the kernel does not fit the device: see :meth:`_failed`).
        """
        try:
            runnable = self.build(config)
        except Exception as exc:
            return Measurement("compile_error", error=describe(exc))
        if getattr(runnable, "compiles_on_first_call", False):
            try:
                runnable(*self.inputs)
                _synchronize(self.task.device)
            except Exception as exc:
                return self._failed(exc)
        return None

    def _failed(self, exc: Exception) -> Measurement:
        """A ``runtime_error``, or ``invalid`` when the candidate does not fit the device (the
        backend says so: it failed to load, before anything ran)."""
        reason = self.backend.out_of_resources(exc)
        if reason is not None:
            return Measurement("invalid", error=reason)
        return Measurement("runtime_error", error=describe(exc))

    def measure(self, config: Mapping[str, Any] | None, cutoff_ms: float | None = None, *,
                again: bool = False) -> Measurement:  # fmt: skip
        """Checks ``config`` once against the reference, then times it (``None``: torch eager);
        a candidate slower than ``cutoff_ms`` is cut short (:mod:`tunecache.timing`); with
        ``again``, a noisy timing is taken once more (:meth:`time`)."""
        from tuner.validation import compare, run_poisoned

        try:
            runnable = self.workload.torch_fn if config is None else self.build(config)
        except Exception as exc:
            return Measurement("compile_error", error=describe(exc))
        try:
            shape = self.workload.output_shape(self.task.problem)
            out = run_poisoned(runnable, self.inputs, shape, self.task.dtype)
            _synchronize(self.task.device)
            with one_torch_thread():
                rel, _max_abs, note = compare(out.to(self.reference.device), self.reference)
        except Exception as exc:
            return self._failed(exc)
        if rel is None or rel > self.tolerance:
            detail = note or f"relative error {rel:.3g} > tolerance {self.tolerance:g}"
            return Measurement("wrong_answer", error=detail, rel_error=rel)
        try:
            timing = self.time(runnable, cutoff_ms, again=again)
        except Exception as exc:
            return Measurement("runtime_error", error=describe(exc))
        return Measurement("ok", timing=timing, rel_error=rel)

    def time(self, runnable: Runnable, cutoff_ms: float | None = None, *,
             again: bool = False) -> TimingModel:  # fmt: skip
        """Times ``runnable`` on the task's inputs with the task's timer; with ``again`` (and no
        ``cutoff_ms``), a noisy timing is taken again, up to :data:`MAX_ATTEMPTS` in all, and the
        least disturbed kept."""
        import dataclasses

        from tunecache.timing import time_cpu, time_cuda

        timer: Any = time_cuda if self.task.device == "cuda" else time_cpu
        if self.task.timer_ref is not None:
            module, _, name = self.task.timer_ref.partition(":")
            timer = getattr(importlib.import_module(module), name)
        inputs = self.inputs
        settings = dataclasses.replace(self.task.timer, cutoff_ms=cutoff_ms)
        timing: TimingModel = timer(lambda: runnable(*inputs), settings)
        attempts = 1
        while again and timing.noisy and cutoff_ms is None and attempts < MAX_ATTEMPTS:
            retimed: TimingModel = timer(lambda: runnable(*inputs), settings)
            attempts += 1
            if _quietness(retimed) < _quietness(timing):
                timing = retimed
        if attempts > 1 and timing.conditions is not None:
            data = timing.model_dump()
            data["conditions"]["attempts"] = attempts
            timing = TimingModel.model_validate(data)
        return timing

    def validate(self, config: Mapping[str, Any], seeds: Sequence[int]) -> ValidationReport:
        """The full validation of ``config`` (seeds and the edge problem), on the task's device."""
        from tuner.validation import validate

        task = self.task

        def build(problem: Mapping[str, int]) -> Runnable:
            if dict(problem) == task.problem:
                return self.build(config)
            return self.backend.build(self.workload, problem, task.dtype, config)

        return validate(build, self.workload, task.problem, task.dtype, seeds=seeds,
                        device=task.device)  # fmt: skip


def _quietness(timing: TimingModel) -> tuple[int, float]:
    """Orders timings least disturbed first: fewer reasons to call them noisy, then less spread."""
    reasons = len(timing.conditions.noise) if timing.conditions is not None else 0
    return reasons, timing.spread


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
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
