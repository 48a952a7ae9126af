"""The TVM backend: MetaSchedule search, knob spaces, and llvm builds of any workload's compute."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from backends.base import (
    Backend,
    Progress,
    Runnable,
    SearchRequest,
    SearchResult,
    import_failure,
)
from tunecache.errors import TunecacheError, TuningError, one_line

if TYPE_CHECKING:
    from tvm.tirx import PrimFunc

    from tunecache.space import SearchSpace
    from workloads.base import Workload

logger = logging.getLogger(__name__)

INSTALL_HINT = "apache-tvm is not installed: pip install 'tunecache[tvm]'"


# Why a search ended short of its trials, said on its last line: "[1/32] … meta_schedule: done"
# said nothing of the 31 trials it did not run.
_STOPPED = {
    "time": "meta_schedule: stopped, the rest of --seconds kept for validating and timing",
    "space": "meta_schedule: done, its space gave no new candidate",
}


class TVMBackend(Backend):
    """Tunes TE computes on this CPU's llvm target: MetaSchedule, or our strategies over knobs.

    Configs are JSON: ``{"schedule": "default"}`` (the unscheduled PrimFunc, the honest no-tuning
    baseline), ``{"schedule": "meta_schedule", "trace": [...], "target": {...}}`` (a
    MetaSchedule trace, replayed on the workload's PrimFunc at build time; what ``search``
    returns), or ``{"schedule": "knobs", "tile_i": 8, ...}`` (a config of the enumerable knob
    ``space``, applied by a hand-written schedule template: :mod:`backends.tvm.knobs`).

    Example:
        >>> from workloads import get_workload
        >>> backend, matmul = TVMBackend(), get_workload("matmul")
        >>> problem = {"M": 64, "N": 64, "K": 64}
        >>> request = SearchRequest(matmul, problem, "float32", Budget(trials=8))
        >>> result = backend.search(request, workdir=tmp)
        >>> run = backend.build(matmul, problem, "float32", result.config)
        >>> out = run(*matmul.make_inputs(problem, "float32", seed=0))
    """

    name: ClassVar[str] = "tvm"
    native_strategy: ClassVar[str | None] = "meta_schedule"

    def unavailable_reason(self) -> str | None:
        """``None`` when TVM imports, else why not (with the install command)."""
        return import_failure(("tvm", "tvm.s_tir.meta_schedule"), "apache-tvm", INSTALL_HINT)

    def space(
        self, workload: Workload, problem: Mapping[str, int], dtype: str
    ) -> SearchSpace | None:
        """The knob space of ``workload`` at ``problem`` (``None`` without a knob template).

        Its configs carry ``"schedule": "knobs"`` and go to :meth:`build` as they are.

        Raises:
            InvalidInput: a dtype TVM does not run the workload in, or a malformed problem.
        """
        from backends.tvm.knobs import has_knobs, knob_space

        return knob_space(workload, problem, dtype) if has_knobs(workload) else None

    def search(self, request: SearchRequest, *, workdir: Path) -> SearchResult:
        """Tunes ``workload`` at ``problem`` with MetaSchedule for this CPU.

        Records go to a JSON database under ``workdir/<sha(target)>-tvm<version>/``; a second
        search of the same workload starts from them and may return an earlier winner. With the
        same seed and database, a search proposes the same candidates
        (:func:`backends.tvm.search.tune`).

        Raises:
            TuningError: no candidate compiled and ran, or the workload's ``tvm_compute`` raised.
        """
        from backends.tvm.search import tune
        from tunecache.tvm.target import canonical_target, host_cores, host_target

        workload, problem, dtype = request.workload, request.problem, request.dtype
        budget, progress = request.budget, request.progress

        started = time.monotonic()
        target = canonical_target(host_target())
        if progress is not None:
            progress(Progress(0, budget.trials, None, "meta_schedule: starting"))
        found = tune(
            self._prim_func(workload, problem, dtype),
            target,
            budget,
            workdir=Path(workdir),
            progress=progress,
            cores=host_cores(),
            seed=request.seed,
            after=request.after,
            started=request.began,
            workers_follow=request.workers_start,
        )
        found.strategy, found.seconds = self.native_strategy or "", time.monotonic() - started
        ok = sum(t.status == "ok" for t in found.trials)
        logger.info(
            "%s %s: %d candidates (%d ok) in %.1f s; best %s",
            workload.name,
            dict(problem),
            len(found.trials),
            ok,
            found.seconds,
            self.summarize(found.config),
        )
        if progress is not None:
            said = _STOPPED.get(found.stopped, "meta_schedule: done")
            progress(Progress(len(found.trials), budget.trials, found.best_ms, said))
        return found

    def build(
        self, workload: Workload, problem: Mapping[str, int], dtype: str, config: Mapping[str, Any]
    ) -> Runnable:
        """Compiles ``config`` for ``workload`` at ``problem`` (any size, not only the tuned one).

        Raises:
            InvalidInput: ``config`` is not a TVM config.
            TuningError: the trace or knob schedule cannot be applied at this problem, or
                compiling failed.
        """
        from backends.tvm.knobs import SCHEDULE_KNOBS, apply_knobs
        from backends.tvm.runnable import compile_module, make_runnable
        from backends.tvm.schedule import SCHEDULE_DEFAULT, apply_trace, config_schedule
        from tunecache.tvm.target import host_target
        from workloads.base import torch_dtype

        # Always this CPU: the runnable must run here. A config tuned on another CPU still
        # replays (a trace names loops and tiles, not instructions) but may be slower.
        target = host_target()
        if config.get("schedule") == SCHEDULE_KNOBS:
            lib = compile_module(apply_knobs(workload, problem, dtype, config), target)
            return make_runnable(lib, workload.output_shape(problem), torch_dtype(dtype))
        kind = config_schedule(config)
        func = self._prim_func(workload, problem, dtype)
        tuned_for = config.get("target")
        if isinstance(tuned_for, Mapping) and tuned_for.get("mcpu") != target.get("mcpu"):
            logger.debug("config tuned for %s, built for %s", tuned_for, target)
        if kind == SCHEDULE_DEFAULT:
            lib = compile_module(func, target)
        else:
            where = f" on {workload.name} {dict(problem)}"
            sch = apply_trace(func, config["trace"], where=where)
            lib = compile_module(sch.mod, target)
        return make_runnable(lib, workload.output_shape(problem), torch_dtype(dtype))

    def summarize(self, config: Mapping[str, Any]) -> str:
        """``default (no schedule)``, ``knobs i8 j32 k16 vec par u16``, or the trace's tiles."""
        from backends.tvm.knobs import SCHEDULE_KNOBS, summarize_knobs
        from backends.tvm.schedule import SCHEDULE_DEFAULT, summarize_trace

        if config.get("schedule") == SCHEDULE_DEFAULT:
            return "default (no schedule)"
        if config.get("schedule") == SCHEDULE_KNOBS:
            return summarize_knobs(config)
        trace = config.get("trace")
        if config.get("schedule") != "meta_schedule" or not isinstance(trace, list):
            return f"unknown TVM config {str(config.get('schedule'))[:30]!r}"
        return summarize_trace(trace)

    @staticmethod
    def _prim_func(workload: Workload, problem: Mapping[str, int], dtype: str) -> PrimFunc:
        """``workload``'s TE compute at ``problem`` as a PrimFunc.

        Raises:
            TuningError: ``tvm_compute`` itself raised (no config can pass), named as the
                Inductor backend names a ``torch_fn`` that raises, or returned what TVM makes
                no PrimFunc of; its traceback at DEBUG.
            TunecacheError: what ``tvm_compute`` raised of ours (a dtype it does not run in:
                :class:`~tunecache.errors.InvalidInput`), as it is.
        """
        from tvm import te

        try:
            tensors = workload.tvm_compute(problem, dtype)
        except TunecacheError:
            raise
        except Exception as exc:  # the workload's code may raise anything
            logger.debug("tvm_compute of %s raised", workload.name, exc_info=True)
            raise TuningError(f"{workload.name}: tvm_compute raised {one_line(exc)}") from exc
        try:
            func: PrimFunc = te.create_prim_func(tensors)
        except Exception as exc:  # not tensors, or not a computation (an internal error before)
            logger.debug("tvm_compute of %s: no PrimFunc", workload.name, exc_info=True)
            raise TuningError(
                f"{workload.name}: tvm_compute returned what TVM makes no PrimFunc "
                f"of (its placeholders, then its output): {one_line(exc)}"
            ) from exc
        return func
