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

from backends import (
    Backend,
    Budget,
    Progress,
    ProgressFn,
    Runnable,
    SearchResult,
    Trial,
    get_backend,
)
from tunecache import __version__
from tunecache.client import Client
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
from tunecache.space import Config
from tunecache.timing import DEFAULT_TIMER, TimerSettings, time_cpu
from tuner.harness import Job
from tuner.search import DEFAULT_STRATEGY, STRATEGIES
from tuner.tune_space import tune_space
from tuner.validation import DEFAULT_SEEDS, validate
from tuner.warm_start import neighbour_configs
from workloads import Workload, get_workload, make_key

logger = logging.getLogger(__name__)
MAX_FALLBACK_CANDIDATES = 5


@dataclass
class TuneOutcome:
    """A finished tuning run: the key, the record to upload, and the winner's runnable."""

    key: Key
    record: RecordCreate
    runnable: Runnable | None  # in-process only for a backend's own search (None: in workers)
    rejected: list[ValidationReport]  # searched winners that failed validation, in order
    trials: list[Trial]  # every measured candidate, with its repeats where kept


def default_workdir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("tunecache")) / "work"


@dataclass
class _Job:
    """One tuning run's fixed parts: what is tuned, with what, and how it is checked and timed."""

    backend: Backend
    workload: Workload
    problem: dict[str, int]
    dtype: str
    seeds: Sequence[int]
    timer: TimerSettings
    emit: Callable[[str], None]

    def builder(self, config: dict[str, Any], built: Runnable | None) -> Callable[..., Runnable]:
        """Builds ``config`` once per problem; ``built`` is the runnable at the tuned problem."""
        cache: dict[tuple[tuple[str, int], ...], Runnable] = {}
        if built is not None:
            cache[tuple(sorted(self.problem.items()))] = built

        def build(p: Mapping[str, int]) -> Runnable:
            key = tuple(sorted(p.items()))
            if key not in cache:
                cache[key] = self.backend.build(self.workload, p, self.dtype, config)
            return cache[key]

        return build

    def validate(self, build: Callable[..., Runnable]) -> ValidationReport:
        return validate(build, self.workload, self.problem, self.dtype, seeds=self.seeds)

    def time(self, runnable: Runnable) -> TimingModel:
        inputs = self.workload.make_inputs(self.problem, self.dtype, seed=0)
        return time_cpu(lambda: runnable(*inputs), self.timer)


@dataclass
class _Winner:
    config: dict[str, Any]
    runnable: Runnable
    report: ValidationReport


def _validated_winner(job: _Job, result: SearchResult) -> tuple[_Winner, list[ValidationReport]]:
    """The best-ranked candidate that passes validation, and the reports of those that failed."""
    rejected: list[ValidationReport] = []
    candidates = [result.config, *result.ranked[: MAX_FALLBACK_CANDIDATES - 1]]
    for i, config in enumerate(candidates):
        job.emit(f"validating candidate {i + 1}/{len(candidates)}: {job.backend.summarize(config)}")
        build = job.builder(config, result.runnable if i == 0 else None)
        report = job.validate(build)
        if report.passed:
            return _Winner(config, build(job.problem), report), rejected
        worst = next(c for c in report.checks if not c.passed)
        job.emit(f"rejected: {worst.note or f'error {worst.rel_error:.3g} > {worst.tolerance:g}'}")
        rejected.append(report)
    raise TuningError(
        f"no candidate of {job.workload.name} on {job.backend.name} passed validation "
        f"({len(rejected)} tried); first failure: {rejected[0].checks}"
    )


def _measure(
    job: _Job, winner: _Winner
) -> tuple[_Winner, TimingModel, list[BaselineModel], list[Trial]]:
    """Times the winner, torch eager and the default config; the default wins if faster and valid.

    Returns the (possibly replaced) winner, its timing, the baselines, and the default config as
    an extra trial when it was measured.
    """
    job.emit("timing winner and baselines")
    timing = job.time(winner.runnable)
    baselines = [BaselineModel(name="torch_eager", timing=job.time(job.workload.torch_fn))]
    default = job.workload.default_config(job.backend.name, job.problem, job.dtype)
    if winner.config == default:
        return winner, timing, baselines, []
    default_runnable = job.backend.build(job.workload, job.problem, job.dtype, default)
    default_timing = job.time(default_runnable)
    baselines.append(BaselineModel(name="default_config", timing=default_timing))
    extra = [Trial(config=default, status="ok", time_ms=default_timing.median_ms)]
    if default_timing.median_ms < timing.median_ms:
        # The untuned config is a candidate too: never store a "tuned" config slower than it.
        job.emit("the default config timed faster than the search's winner; validating it")
        report = job.validate(job.builder(default, default_runnable))
        if report.passed:
            return _Winner(default, default_runnable, report), default_timing, baselines, extra
    return winner, timing, baselines, extra


@dataclass
class _Found:
    """A validated, timed winner and how it was found."""

    config: dict[str, Any]
    timing: TimingModel
    report: ValidationReport
    baselines: list[BaselineModel]
    trials: list[Trial]
    rejected: list[ValidationReport]
    runnable: Runnable | None


def _tune_native(job: _Job, budget: Budget, workdir: Path, progress: ProgressFn | None) -> _Found:
    """The backend's own search, then validation and timing in this process."""
    result = job.backend.search(
        job.workload, job.problem, job.dtype, budget, workdir=workdir, progress=progress
    )
    winner, rejected = _validated_winner(job, result)
    winner, timing, baselines, extra = _measure(job, winner)
    return _Found(winner.config, timing, winner.report, baselines,
                  [*result.trials, *extra], rejected, winner.runnable)  # fmt: skip


def tune(
    workload_name: str,
    backend_name: str,
    problem: Mapping[str, Any],
    dtype: str,
    budget: Budget,
    *,
    strategy: str | None = None,
    seed: int = 0,
    warm_start: Sequence[Config] = (),
    workdir: Path | None = None,
    progress: ProgressFn | None = None,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    timer: TimerSettings = DEFAULT_TIMER,
    backend: Backend | None = None,
    backend_ref: str | None = None,
    workers: int | None = None,
    run_timeout: float = 60.0,
    cache: Client | None = None,
) -> TuneOutcome:
    """Tunes one key and returns the validated record, ready to upload.

    Args:
        strategy: the backend's own search (``meta_schedule``, ``inductor_max_autotune``) or one
            of :data:`tuner.search.STRATEGIES` over the backend's enumerable space; default: the
            backend's own where it has one, else ``optuna``.
        warm_start: configs to try first (the winners of neighbouring keys).
        backend: an already built backend instance (tests inject one); by name otherwise.
        backend_ref: how measurement workers import ``backend`` (``"module:Class"``); its name
            by default.
        workers: measurement worker processes for enumerable searches (default: CPU count).
        run_timeout: seconds one candidate's check and timing may take before it is killed.
        cache: a cache server whose winners for neighbouring keys warm-start the search.

    Raises:
        InvalidInput: unknown workload, backend, dtype or strategy, or a malformed problem.
        TuningError: the backend is unavailable, or no candidate passed validation.
    """
    workload = get_workload(workload_name)
    key = make_key(workload, backend_name, problem, dtype)
    backend = backend or get_backend(backend_name)
    if backend.name != backend_name:
        raise InvalidInput(f"backend instance {backend.name!r} is not {backend_name!r}")
    if (reason := backend.unavailable_reason()) is not None:
        raise TuningError(f"backend {backend_name} is unavailable: {reason}")
    native = backend.native_strategy
    strategy = strategy or native or DEFAULT_STRATEGY
    if strategy != native and strategy not in STRATEGIES:
        known = ", ".join(sorted({*STRATEGIES, *([native] if native else [])}))
        raise InvalidInput(f"unknown strategy {strategy!r} for {backend_name}; known: {known}")

    def emit(message: str, done: int = 0, total: int = 0) -> None:
        logger.info("%s: %s", key.short(), message)
        if progress is not None:
            progress(Progress(done=done, total=total, message=message))

    job = _Job(backend, workload, workload.problem(problem), dtype, seeds, timer, emit)
    emit(f"searching with {strategy} ({budget.trials} trials)", 0, budget.trials)
    started = time.perf_counter()
    if strategy == native:
        found = _tune_native(job, budget, workdir or default_workdir(), progress)
    else:
        harness_job = Job(
            backend=backend_ref or backend.name,
            workload=workload.name,
            problem=job.problem,
            dtype=dtype,
            device=backend.device(),
            timer=timer,
        )
        measured = tune_space(
            backend, workload, harness_job, budget, strategy=strategy, seed=seed,
            warm_start=warm_start, seeds=seeds, workers=workers, run_timeout=run_timeout,
            progress=progress, emit=emit,
            neighbours=(lambda space: neighbour_configs(cache, key, space)) if cache else None,
        )  # fmt: skip
        found = _Found(
            measured.config, measured.timing, measured.report, measured.baselines,
            [*measured.log.trials, *measured.extra_trials], measured.rejected, None,
        )  # fmt: skip
    timing, report = found.timing, found.report
    record = RecordCreate(
        key=KeyModel.from_key(key),
        config=found.config,
        config_summary=backend.summarize(found.config)[:256],
        timing=timing,
        baselines=found.baselines,
        validation=report,
        search=SearchModel(
            strategy=strategy,
            trials=len(found.trials),
            seconds=round(time.perf_counter() - started, 3),
        ),
        trials=[_trial_model(t) for t in found.trials],
        provenance=Provenance(
            machine=platform.node(), tool_version=__version__, device_raw_name=key.device.raw_name
        ),
    )
    emit(f"done: {timing.median_ms:.4f} ms, validated (max error {report.max_rel_error:.2e})")
    return TuneOutcome(key=key, record=record, runnable=found.runnable, rejected=found.rejected,
                       trials=found.trials)  # fmt: skip


def _trial_model(trial: Trial) -> TrialModel:
    return TrialModel(config=dict(trial.config), status=trial.status, time_ms=trial.time_ms,
                      error=trial.error[:2048])  # fmt: skip
