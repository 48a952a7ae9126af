"""Tune one key: search, validate the winner, time it against the baselines, build the record.

A searched winner that fails validation never becomes the record: the next-best configs the search
ranked are validated in turn, and if none passes the run raises :class:`TuningError`.

Example:
    >>> from backends import Budget
    >>> outcome = tune("matmul", "tvm", {"M": 64, "N": 64, "K": 64}, "float32",
    ...                Budget(trials=8))  # doctest: +SKIP
    >>> outcome.record.validation.passed  # doctest: +SKIP
    True
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends import Backend, Budget, Progress, ProgressFn, Runnable, SearchResult, get_backend
from tunecache import __version__
from tunecache.errors import InvalidInput, TuningError
from tunecache.key import Key
from tunecache.schemas import (
    BaselineModel,
    KeyModel,
    Provenance,
    RecordCreate,
    SearchModel,
    TimingModel,
    TrialModel,
    ValidationReport,
)
from tuner.timing import DEFAULT_TIMER, TimerSettings, time_cpu
from tuner.validation import DEFAULT_SEEDS, validate
from workloads import Workload, get_workload, make_key

logger = logging.getLogger(__name__)
MAX_FALLBACK_CANDIDATES = 5


@dataclass
class TuneOutcome:
    """A finished tuning run: the key, the record to upload, and the winner's runnable."""

    key: Key
    record: RecordCreate
    runnable: Runnable
    rejected: list[ValidationReport]  # searched winners that failed validation, in order


def default_workdir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("tunecache")) / "work"


def _time_runnable(
    runnable: Runnable,
    workload: Workload,
    problem: Mapping[str, int],
    dtype: str,
    timer: TimerSettings,
) -> TimingModel:
    inputs = workload.make_inputs(problem, dtype, seed=0)
    return time_cpu(lambda: runnable(*inputs), timer)


def _validated_winner(
    backend: Backend,
    workload: Workload,
    problem: Mapping[str, int],
    dtype: str,
    result: SearchResult,
    seeds: Sequence[int],
    emit: Callable[[str], None],
) -> tuple[dict[str, Any], Runnable, ValidationReport, list[ValidationReport]]:
    rejected: list[ValidationReport] = []
    candidates = [result.config, *result.ranked[: MAX_FALLBACK_CANDIDATES - 1]]
    for i, config in enumerate(candidates):
        emit(f"validating candidate {i + 1}/{len(candidates)}: {backend.summarize(config)}")
        first = result.runnable if i == 0 else None

        def build(
            p: Mapping[str, int], config: dict[str, Any] = config, first: Any = first
        ) -> Runnable:
            if first is not None and dict(p) == dict(problem):
                return first
            return backend.build(workload, p, dtype, config)

        report = validate(build, workload, problem, dtype, seeds=seeds)
        if report.passed:
            return config, build(problem), report, rejected
        worst = next(c for c in report.checks if not c.passed)
        emit(f"rejected: {worst.note or f'error {worst.rel_error:.3g} > {worst.tolerance:g}'}")
        rejected.append(report)
    raise TuningError(
        f"no candidate of {workload.name} on {backend.name} passed validation "
        f"({len(rejected)} tried); first failure: {rejected[0].checks}"
    )


def tune(
    workload_name: str,
    backend_name: str,
    problem: Mapping[str, Any],
    dtype: str,
    budget: Budget,
    *,
    workdir: Path | None = None,
    progress: ProgressFn | None = None,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    timer: TimerSettings = DEFAULT_TIMER,
    backend: Backend | None = None,
) -> TuneOutcome:
    """Tunes one key and returns the validated record, ready to upload.

    Args:
        backend: an already built backend instance (tests inject one); by name otherwise.

    Raises:
        InvalidInput: unknown workload, backend or dtype, or a malformed problem.
        TuningError: the backend is unavailable, or no candidate passed validation.
    """
    workload = get_workload(workload_name)
    key = make_key(workload, backend_name, problem, dtype)
    problem = dict(key.problem)
    backend = backend or get_backend(backend_name)
    if backend.name != backend_name:
        raise InvalidInput(f"backend instance {backend.name!r} is not {backend_name!r}")
    if (reason := backend.unavailable_reason()) is not None:
        raise TuningError(f"backend {backend_name} is unavailable: {reason}")

    def emit(message: str, done: int = 0, total: int = 0, best: float | None = None) -> None:
        logger.info("%s: %s", key.short(), message)
        if progress is not None:
            progress(Progress(done=done, total=total, best_ms=best, message=message))

    emit(f"searching ({budget.trials} trials)", 0, budget.trials)
    started = time.perf_counter()
    result = backend.search(
        workload, problem, dtype, budget, workdir=workdir or default_workdir(), progress=progress
    )
    config, runnable, report, rejected = _validated_winner(
        backend, workload, problem, dtype, result, seeds, emit
    )
    emit("timing winner and baselines")
    timing = _time_runnable(runnable, workload, problem, dtype, timer)
    baselines = [
        BaselineModel(
            name="torch_eager",
            timing=_time_runnable(workload.torch_fn, workload, problem, dtype, timer),
        )
    ]
    default = workload.default_config(backend_name)
    if config != default:
        default_runnable = backend.build(workload, problem, dtype, default)
        baselines.append(
            BaselineModel(
                name="default_config",
                timing=_time_runnable(default_runnable, workload, problem, dtype, timer),
            )
        )
    record = RecordCreate(
        key=KeyModel.from_key(key),
        config=config,
        config_summary=backend.summarize(config)[:256],
        timing=timing,
        baselines=baselines,
        validation=report,
        search=SearchModel(
            strategy=result.strategy,
            trials=len(result.trials),
            seconds=round(time.perf_counter() - started, 3),
        ),
        trials=[
            TrialModel(
                config=dict(t.config), status=t.status, time_ms=t.time_ms, error=t.error[:2048]
            )
            for t in result.trials
        ],
        provenance=Provenance(
            machine=platform.node(), tool_version=__version__, device_raw_name=key.device.raw_name
        ),
    )
    emit(f"done: {timing.median_ms:.4f} ms, validated (max error {report.max_rel_error:.2e})")
    return TuneOutcome(key=key, record=record, runnable=runnable, rejected=rejected)
