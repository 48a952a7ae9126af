"""Tuning over an enumerable space: our strategies drive the isolating measurement harness.

Every step that runs a candidate runs in a worker process — the search, the re-timing of the top
few, the golden-reference validation and the baselines — so no candidate can take the tuner down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from backends import Backend, Budget, ProgressFn, Trial
from tunecache.errors import InvalidInput, TuningError
from tunecache.schemas import BaselineModel, TimingModel, ValidationReport
from tunecache.space import Config, SearchSpace
from tuner.harness import Harness, Job
from tuner.search import SearchLog, get_strategy, run_search
from workloads.base import Workload

logger = logging.getLogger(__name__)
RETIME_TOP = 3  # the fastest few are timed again before a winner is named (noise)


@dataclass
class SpaceOutcome:
    config: dict[str, Any]
    timing: TimingModel
    report: ValidationReport
    baselines: list[BaselineModel]
    log: SearchLog
    rejected: list[ValidationReport] = field(default_factory=list)
    extra_trials: list[Trial] = field(default_factory=list)


def enumerable_space(backend: Backend, workload: Workload, problem: Mapping[str, int],
                     dtype: str) -> SearchSpace:  # fmt: skip
    """The backend's space for this key, or a clear error why there is none to search here."""
    if (reason := backend.measures_meaningfully()) is not None:
        raise InvalidInput(f"cannot tune {backend.name} here: {reason}")
    space = backend.space(workload, problem, dtype)
    if space is None:
        native = backend.native_strategy
        raise InvalidInput(
            f"{backend.name} has no enumerable space; its search strategy is {native!r}"
        )
    return space


def _timing(answer: dict[str, Any]) -> TimingModel | None:
    return TimingModel.model_validate(answer["timing"]) if answer.get("status") == "ok" else None


def _winner(
    harness: Harness, log: SearchLog, seeds: Sequence[int], emit: Callable[[str], None]
) -> tuple[Config, TimingModel, ValidationReport, list[ValidationReport]]:
    """Re-times the top few, then validates them fastest first; the first to pass wins."""
    ranked = [config for config, _ in log.ranked()[:RETIME_TOP]]
    if not ranked:
        raise TuningError(f"no candidate ran correctly; failures: {dict(harness.failures)}")
    emit(f"re-timing the top {len(ranked)} candidates")
    timed = [(c, t) for c in ranked if (t := _timing(harness.measure(c))) is not None]
    timed.sort(key=lambda item: item[1].median_ms)
    rejected: list[ValidationReport] = []
    for config, timing in timed:
        emit(f"validating {config}")
        report = harness.validate(config, seeds)
        if report.passed:
            return config, timing, report, rejected
        rejected.append(report)
    raise TuningError(f"none of the {len(ranked)} fastest candidates passed validation")


def tune_space(
    backend: Backend,
    workload: Workload,
    job: Job,
    budget: Budget,
    *,
    strategy: str,
    seed: int,
    warm_start: Sequence[Config],
    seeds: Sequence[int],
    workers: int | None,
    run_timeout: float,
    progress: ProgressFn | None,
    emit: Callable[[str], None],
    neighbours: Callable[[SearchSpace], list[Config]] | None = None,
) -> SpaceOutcome:
    """Searches ``backend``'s space for ``job`` with ``strategy`` and names a validated winner.

    Args:
        neighbours: finds warm-start configs in the space (the cache's neighbouring winners).
    """
    space = enumerable_space(backend, workload, job.problem, job.dtype)
    emit(f"space: {space.size} configs, {space.pruned_count()} pruned by device limits")
    if neighbours is not None:
        found = neighbours(space)
        emit(f"warm start: {len(found)} configs of neighbouring keys from the cache")
        warm_start = [*warm_start, *found]
    with Harness(job, workers=workers, run_timeout=run_timeout) as harness:
        searcher = get_strategy(strategy, space, seed=seed, warm_start=warm_start)
        log = run_search(
            searcher, harness.evaluate, budget, batch_size=harness.workers, progress=progress
        )
        emit(f"searched {len(log)} configs ({log.stopped_because}); failures: "
             f"{dict(harness.failures) or 'none'}")  # fmt: skip
        config, timing, report, rejected = _winner(harness, log, seeds, emit)
        baselines, extra = _baselines(harness, workload, backend.name)
        default = next((b for b in baselines if b.name == "default_config"), None)
        if default is not None and default.timing.median_ms < timing.median_ms:
            emit("the default config timed faster than the search's winner; validating it")
            default_config = Config.of(
                workload.default_config(backend.name, job.problem, job.dtype)
            )
            default_report = harness.validate(default_config, seeds)
            if default_report.passed:
                config, timing, report = default_config, default.timing, default_report
    return SpaceOutcome(config.to_json(), timing, report, baselines, log, rejected, extra)


def _baselines(
    harness: Harness, workload: Workload, backend: str
) -> tuple[list[BaselineModel], list[Trial]]:
    baselines: list[BaselineModel] = []
    extra: list[Trial] = []
    if (eager := _timing(harness.measure(None))) is not None:
        baselines.append(BaselineModel(name="torch_eager", timing=eager))
    try:
        job = harness.job
        default = Config.of(workload.default_config(backend, job.problem, job.dtype))
    except NotImplementedError:
        return baselines, extra
    answer = harness.measure(default)
    if (timing := _timing(answer)) is not None:
        baselines.append(BaselineModel(name="default_config", timing=timing))
        extra.append(Trial(config=default.to_json(), status="ok", time_ms=timing.median_ms))
    else:
        extra.append(Trial(config=default.to_json(), status=answer["status"],
                           error=str(answer.get("error", ""))[:2000]))  # fmt: skip
    return baselines, extra
