"""The first half of the pipeline: a search that yields ranked candidates.

Two kinds of search produce the same :class:`~backends.base.SearchResult`: one of our strategies
over a backend's enumerable space, measured through a :class:`~tuner.measure.Benchmarker` (its top
few are re-timed before validation, since one timing is noise), and a backend's own search
(MetaSchedule, Inductor's max-autotune), whose ranking stands. :func:`tuner.select.select_winner`
takes it from there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from backends import Backend, SearchRequest, SearchResult
from tunecache.configcheck import as_run, config_problem
from tunecache.errors import InvalidInput
from tunecache.interleave import MIN_ROUNDS
from tunecache.key import Key
from tunecache.schemas import Trial
from tunecache.space import Config, SearchSpace
from tuner.measure import Benchmarker, Pipelines
from tuner.search import STRATEGIES, get_strategy, run_search
from workloads import Workload

RETIME_TOP = 3  # the fastest few of a strategy's search are timed again before validation
MAX_NATIVE_CANDIDATES = 5  # a backend's own search: its best and next-best, validated in order
# What follows a backend's own search within --seconds, in its builds and measurements (as
# tuner.measure's AFTER_SEARCH_* for a strategy's): each candidate built again and re-timed
# in one process, the default and the edge problem built, the validation, and at least
# MIN_ROUNDS rounds of the final comparison of three.
NATIVE_AFTER_BUILDS = MAX_NATIVE_CANDIDATES + 2
NATIVE_AFTER_MEASURES = MAX_NATIVE_CANDIDATES + 1 + 3 * MIN_ROUNDS


def native_after(build: float, measure: float) -> float:
    """The seconds what follows a backend's own search takes, from one candidate's build and
    measurement seconds in it (:attr:`backends.base.SearchRequest.after`)."""
    return NATIVE_AFTER_BUILDS * build + NATIVE_AFTER_MEASURES * measure


class Emit(Protocol):
    """Reports one step of a tuning run (see :class:`backends.base.Progress` for phases)."""

    def __call__(
        self, message: str, *, phase: str = "search", done: int = 0, total: int = 0
    ) -> None: ...


REFUSED_AT_KEY = (
    "a verifier of the cache rejected this config at this key, or it is disputed there: not served"
)


def servable(
    found: SearchResult, key: Key, default: Mapping[str, Any] | None = None,
    refused: Sequence[Mapping[str, Any]] = (),
) -> SearchResult:  # fmt: skip
    """``found`` without the candidates no record may hold: a config outside its backend's
    closed schema (:func:`tunecache.configcheck.config_problem`) could never be served, nor one
    of ``refused`` (rejected at this key by a verifier of the cache, which stores a new upload
    of it disputed), so it never wins; each is kept as an ``invalid`` trial saying why. When
    that leaves none, the ``default`` config is the candidate (unless refused too)."""
    ranked: list[dict[str, Any]] = []
    left_out: list[Trial] = []
    rejected = _runs_as(key, refused)
    for config in found.ranked:
        why = config_problem(key.backend, config, kernel=key.kernel, device=key.device.kind)
        if why is None and not (rejected and _runs_as(key, [config]) & rejected):
            ranked.append(config)
            continue
        error = REFUSED_AT_KEY if why is None else f"outside the {key.backend} closed schema: {why}"
        left_out.append(Trial(config=config, status="invalid", error=error[:2000]))
    if left_out and not ranked and unrefused(default, refused, key) is not None:
        assert default is not None
        ranked.append(dict(default))
    return dataclasses.replace(found, ranked=ranked, trials=[*found.trials, *left_out],
                               runnable=None)  # fmt: skip


def unrefused(
    default: Mapping[str, Any] | None, refused: Sequence[Mapping[str, Any]], key: Key
) -> Mapping[str, Any] | None:
    """``default``, or ``None`` when it is one of ``refused``: then it is neither a candidate nor
    the config that replaces a winner it was not beaten by."""
    if default is None or not refused or not _runs_as(key, [default]) & _runs_as(key, refused):
        return default
    return None


def _runs_as(key: Key, configs: Sequence[Mapping[str, Any]]) -> set[str]:
    """The configs as they run at ``key`` (:func:`tunecache.configcheck.as_run`: ``True`` is not
    ``1``, so a near copy a verifier rejected refuses nothing else)."""
    shown = (as_run(key.backend, dict(config), kernel=key.kernel) for config in configs)
    return {each for each in shown if each is not None}


def enumerable_space(backend: Backend, workload: Workload, problem: Mapping[str, int],
                     dtype: str) -> SearchSpace:  # fmt: skip
    """The backend's space for this key, or a clear error why there is none to search."""
    space = backend.space(workload, problem, dtype)
    if space is None:
        native = backend.native_strategy
        raise InvalidInput(
            f"{workload.name} has no config space of its own on {backend.name} for a strategy "
            f"to search: its search there is {native!r} (the strategy to ask for, or none)"
        )
    return space


def search_space(
    backend: Backend,
    request: SearchRequest,
    bench: Benchmarker,
    *,
    strategy: str,
    seed: int,
    warm_start: Sequence[Config],
    emit: Emit,
    neighbours: Callable[[SearchSpace], list[Config]] | None = None,
    prior_of: Callable[[SearchSpace], dict[Config, float]] | None = None,
) -> SearchResult:
    """Searches the backend's space with ``strategy``, measuring through ``bench``.

    Args:
        neighbours: finds warm-start configs in the space (the cache's neighbouring winners).
        prior_of: scores the space's configs from the cache's trials on other devices and
            shapes, for the strategies that model the space (``bayes``, ``portfolio``).
    """
    space = enumerable_space(backend, request.workload, request.problem, request.dtype)
    emit(f"space: {space.size} configs, {space.pruned_count()} pruned by device limits")
    if neighbours is not None:
        found = neighbours(space)
        emit(f"warm start: {len(found)} configs of neighbouring keys from the cache")
        warm_start = [*warm_start, *found]
    prior = None
    known = STRATEGIES.get(strategy)  # an unknown one is refused by get_strategy, below
    if prior_of is not None and known is not None and known.uses_prior:
        prior = prior_of(space)
        emit(f"prior: {len(prior)} configs scored by neighbouring keys' trials in the cache")
    searcher = get_strategy(strategy, space, seed=seed, warm_start=warm_start, prior=prior)
    log = run_search(searcher, bench.evaluate, request.budget, batch_size=bench.parallelism,
                     progress=request.progress, after=bench.seconds_after_search,
                     set_up=bench.seconds_setting_up, started=request.began,
                     prefetch=bench.prefetch if isinstance(bench, Pipelines) else None)  # fmt: skip
    failures = [t.status for t in log.trials if t.status != "ok"]
    share = 100 * log.choosing / log.seconds if log.seconds > 0 else 0.0
    emit(f"searched {len(log)} configs ({log.stopped_because}) in {log.seconds:.1f} s, "
         f"{log.choosing:.2f} s ({share:.1f} %) of it choosing them; "
         f"{len(failures)} failed")  # fmt: skip
    return log.result(top=RETIME_TOP)


def search_native(backend: Backend, request: SearchRequest, workdir: Path,
                  workers_start: bool = True) -> SearchResult:  # fmt: skip
    """The backend's own search, run here; its candidates are measured by the pipeline. Within
    ``--seconds`` it leaves what follows it the time :func:`native_after` estimates, and with
    ``workers_start`` the measurement workers' start after it."""
    if request.budget.seconds is not None:
        request = dataclasses.replace(request, after=native_after, workers_start=workers_start)
    result = backend.search(request, workdir=workdir)
    # its runnable (Inductor's compiled model) is not kept: every candidate is built again
    return dataclasses.replace(result, ranked=result.ranked[:MAX_NATIVE_CANDIDATES],
                               runnable=None)  # fmt: skip
