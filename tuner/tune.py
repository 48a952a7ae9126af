"""Tune one key: search, validate the winner, time it against the baselines, build the record.

:func:`tune` tunes exactly the key it is given — the daemon hands it keys from the server — and
refuses one that is not this machine's (another device, other software versions, another version
of the kernel's source). One pipeline serves every backend: a search yields ranked candidates
(:mod:`tuner.candidates`), and :func:`tuner.select.select_winner` validates and times them through
the isolating harness with the device's timer. A harness passed in is reused (the daemon keeps one
for every key it tunes).

Example:
    >>> from backends import Budget
    >>> from tunecache import key_for
    >>> key = key_for("matmul", "tvm", {"M": 64, "N": 64, "K": 64}, "float32")
    >>> outcome = tune(key, Budget(trials=8))  # doctest: +SKIP
    >>> outcome.record.validation.passed  # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from backends import (
    Backend,
    Budget,
    Progress,
    ProgressFn,
    SearchRequest,
    SearchResult,
    compile_target,
    get_backend,
)
from tunecache import __version__, devicelock, search_times
from tunecache.client import Client
from tunecache.configcheck import config_problem
from tunecache.device import DeviceFingerprint, local_device
from tunecache.environment import environment_for
from tunecache.errors import InvalidInput, TuningError, validation_problems
from tunecache.folders import output_dir
from tunecache.kernels import nearest
from tunecache.key import Key
from tunecache.schemas import (
    MAX_TRIALS,
    MAX_TRIALS_BYTES,
    KeyModel,
    Provenance,
    RecordCreate,
    SearchModel,
    Trial,
    ValidationReport,
)
from tunecache.settings import work_dir
from tunecache.space import Config
from tunecache.strict import UNSHOWN
from tunecache.timing import DEFAULT_TIMER, TimerSettings
from tuner.candidates import Emit, search_native, search_space, servable, unrefused
from tuner.harness import Harness, Task
from tuner.harness.discipline import reserved_cores
from tuner.measure import Pipelines
from tuner.search import DEFAULT_STRATEGY, STRATEGIES
from tuner.search.loop import trial_time
from tuner.select import Winner, select_winner
from tuner.validation import DEFAULT_SEEDS
from tuner.warm_start import neighbour_configs, neighbour_prior
from workloads import Workload, get_workload

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TuneOptions:
    """How a key is tuned, beyond its budget.

    Attributes:
        strategy: the backend's own search (``meta_schedule``, ``inductor_max_autotune``) or one
            of :data:`tuner.search.STRATEGIES`; default: the backend's own, else ``bayes``.
        warm_start: configs to try first (the winners of neighbouring keys).
        seeds: input seeds of the validation.
        timer_ref: ``"module:function"`` of a timer to use instead of the device's (tests time
            interpreter kernels so; without it a backend that cannot time here is refused).
        workers: harness worker processes when :func:`tune` starts its own (default: CPUs).
        run_timeout: seconds one candidate's check and timing may take before it is killed.
        backend_ref: how the workers import an injected backend (``"module:Class"``).
        compile_ahead: compile candidates in the harness's compile farm, on every core and
            ahead of the one process that times them, when the backend can compile without the
            device (Triton on a GPU: :meth:`backends.base.Backend.compile_target`); ``False``:
            each compiles in the worker that times it.
        refused: configs a verifier of the cache rejected at this key (a daemon's re-tune of a
            key whose record was rejected): never the winner, as the cache would not serve them.
    """

    strategy: str | None = None
    seed: int = 0
    warm_start: tuple[Config, ...] = ()
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    timer: TimerSettings = DEFAULT_TIMER
    timer_ref: str | None = None
    workers: int | None = None
    run_timeout: float = 60.0
    workdir: Path | None = None
    backend_ref: str | None = None
    compile_ahead: bool = True
    refused: tuple[Mapping[str, Any], ...] = ()


@dataclass
class TuneOutcome:
    """A finished tuning run: the key, the record to upload, and what was tried on the way."""

    key: Key
    record: RecordCreate
    rejected: list[ValidationReport]  # of the candidates that failed validation, in order
    trials: list[Trial]  # every measured candidate, with its spread where kept
    timer_compiles: int = 0  # compiles run in the processes that timed (the farm keeps it 0)


def default_workdir() -> Path:
    """``$TUNECACHE_WORK_DIR``, else ``work`` in the user cache dir (:mod:`tunecache.settings`),
    made if need be: every backend's search, and ``tune --tvm``, take it from here.

    Raises:
        InvalidInput: it cannot be made, is not a folder or is not writable (one line naming
            the variable and the path: the CLI's exit 2, as for its other local paths).
    """
    return output_dir(work_dir(), "TUNECACHE_WORK_DIR folder")


def check_local(key: Key, workload: Workload) -> None:
    """Raises :class:`InvalidInput` unless ``key`` can be tuned on this machine.

    The key must be one a server stores (a user kernel's string parameter holding a control
    character failed at the upload, after the whole search), its device this machine's device of
    that kind, its environment the installed versions, its source hash the kernel's current
    sources; and ``TUNECACHE_TIMING_CORES``, if set, must name cores this process may use.
    """
    for name, value in key.problem.items():  # said plainly (the schema's says it per union arm)
        if isinstance(value, str) and (found := UNSHOWN.search(value)) is not None:
            raise InvalidInput(
                f"key {key.short()}: problem.{name} holds the control character "
                f"U+{ord(found.group()):04X}: a server stores printable text only"
            )
    try:
        KeyModel.from_key(key)
    except ValidationError as exc:
        raise InvalidInput(f"key {key.short()}: {validation_problems(exc)}") from None
    here = local_device(key.device.kind).fingerprint
    if here != key.device:
        raise InvalidInput(
            f"key {key.short()} is for {key.device.kind} device {key.device.name} "
            f"({key.device.arch}, {key.device.units} units); this machine's is {here.name} "
            f"({here.arch}, {here.units} units): tune it on a machine with that device"
        )
    installed = environment_for(key.backend)
    if dict(key.environment) != installed:
        raise InvalidInput(f"key {key.short()} is for {dict(key.environment)}; here: {installed}")
    if workload.source_hash(key.backend) != key.source_hash:
        raise InvalidInput(
            f"key {key.short()} has source hash {key.source_hash}; {workload.name}'s sources "
            f"here hash to {workload.source_hash(key.backend)}"
        )
    check_memory(key, workload)
    reserved_cores()  # a bad TUNECACHE_TIMING_CORES: said now, not after the whole search


# The share of a CPU's host memory a tune leaves free: the inputs and output are not all it holds
# (the harness's worker, the compiler, the timing), and the machine runs other processes. A
# matmul needing 22.6 GiB on a 23.5 GiB box was claimed and tuned until memory ran out. Against
# the total, not what is free at the moment: a daemon fails a job it refuses, and a moment of
# someone else's use would spend all its attempts in a second. A GPU's memory is the tune's own.
MEMORY_HEADROOM = 0.2


def check_memory(key: Key, workload: Workload | None = None) -> None:
    """Raises :class:`InvalidInput` when ``key``'s inputs and output cannot fit in its device's
    memory (a CPU's less :data:`MEMORY_HEADROOM`): said before any work (the CLI asks before its
    progress starts; a daemon fails the job, a verifier gives the record back)."""
    workload = workload or get_workload(key.kernel)
    needed = workload.memory_needed(_problem(key), key.dtype)
    if (why := memory_problem(needed, _memory(key.device), key.device.kind)) is not None:
        raise InvalidInput(f"{key.short()}: {why}")


def memory_problem(needed: int, total: int, kind: str) -> str | None:
    """Why ``needed`` bytes do not fit in a ``kind`` device of ``total`` bytes (a CPU's with
    :data:`MEMORY_HEADROOM` left free), or ``None`` (also where ``total`` is unknown: 0).

    Example:
        >>> memory_problem(22 * 2**30, 24 * 2**30, "cpu")[-51:]
        'a tune uses at most 80 %, 19.2 GiB: a smaller shape'
    """
    usable = total * (1 - MEMORY_HEADROOM) if kind == "cpu" else total
    if not total or needed <= usable:
        return None
    share = (f", of which a tune uses at most {1 - MEMORY_HEADROOM:.0%}".replace("%", " %")
             + f", {usable / 2**30:.3g} GiB") if usable < total else ""  # fmt: skip
    return (f"its inputs and output need {needed / 2**30:.3g} GiB; this {kind} device has "
            f"{total / 2**30:.3g} GiB{share}: a smaller shape")  # fmt: skip


def _memory(device: DeviceFingerprint) -> int:
    """Bytes of memory ``device`` has (0: unknown): a GPU's own, a CPU's host memory."""
    if device.kind != "cpu":
        return device.memory_gb * 2**30
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 0


def plan(key: Key, options: TuneOptions, backend: Backend | None = None) -> tuple[Backend, str]:
    """The backend and strategy for ``key``, refusing what cannot run or time here (a caller
    may ask before it starts anything: ``tunecache tune`` before its progress line)."""
    backend = backend or get_backend(key.backend)
    if backend.name != key.backend:
        raise InvalidInput(f"backend instance {backend.name!r} is not {key.backend!r}")
    if (reason := backend.unavailable_reason()) is not None:
        raise TuningError(f"backend {key.backend} is unavailable: {reason}")
    if options.timer_ref is None and (reason := backend.measures_meaningfully()) is not None:
        raise InvalidInput(f"cannot tune {backend.name} here: {reason}")
    strategy = options.strategy or backend.native_strategy or DEFAULT_STRATEGY
    if (why := strategy_problem(backend, strategy)) is not None:
        raise InvalidInput(why)
    return backend, strategy


def strategy_problem(backend: Backend, strategy: str | None) -> str | None:
    """Why ``strategy`` cannot tune on ``backend``, or ``None`` (``None``: its default): a
    manifest's entries are held to this when queued, a tune when it starts."""
    native = backend.native_strategy
    if strategy is None or strategy == native:
        return None
    searchable = type(backend).space is not Backend.space  # an enumerable space for ours
    if strategy not in STRATEGIES:  # the strategies it takes: never one then refused
        known = ", ".join(
            sorted({*(STRATEGIES if searchable else ()), *([native] if native else [])})
        )
        near = nearest(strategy, known.split(", "))
        return f"unknown strategy {strategy!r} for {backend.name}{near}; known: {known}"
    if not searchable:
        return f"{backend.name} has no space to search with {strategy!r}; its search is {native!r}"
    return None


def _emitter(key: Key, progress: ProgressFn | None) -> Emit:
    def emit(message: str, *, phase: str = "search", done: int = 0, total: int = 0) -> None:
        logger.info("%s: %s", key.short(), message)
        if progress is not None:
            progress(Progress(done=done, total=total, message=message, phase=phase))

    return emit


def _problem(key: Key) -> dict[str, int]:
    return {k: int(v) for k, v in key.problem.items()}  # a workload's keys hold sizes only


def default_config(workload: Workload, key: Key) -> dict[str, Any] | None:
    """The kernel's default config, a candidate too (``None``: none, or one no record may hold)."""
    try:
        config = workload.default_config(key.backend, _problem(key), key.dtype)
    except NotImplementedError:
        return None
    why = None if config is None else config_problem(key.backend, config, kernel=key.kernel,
                                                     device=key.device.kind)  # fmt: skip
    if why is not None:
        logger.warning("%s: the default config %s is outside the closed schema (%s); not a "
                       "candidate", key.short(), config, why)  # fmt: skip
        return None
    return config


def tune(
    key: Key,
    budget: Budget,
    options: TuneOptions = TuneOptions(),
    *,
    harness: Harness | None = None,
    backend: Backend | None = None,
    cache: Client | None = None,
    progress: ProgressFn | None = None,
) -> TuneOutcome:
    """Tunes ``key`` on this machine and returns the validated record, ready to upload.

    Args:
        harness: measurement workers to reuse (kept open); by default one is started and closed.
        backend: an already built backend instance (tests inject one); by name otherwise.
        cache: a cache server whose winners for neighbouring keys warm-start the search.

    Raises:
        InvalidInput: the key is not this machine's, or an unknown strategy.
        TuningError: the backend is unavailable, or no candidate passed validation.
    """
    workload = get_workload(key.kernel)
    backend, strategy = plan(key, options, backend)
    check_local(key, workload)
    devicelock.check_folder()  # said here, once: not again by each worker process
    emit = _emitter(key, progress)
    began = time.monotonic()  # --seconds bound the whole tune: starting the workers counts
    request = SearchRequest(workload, _problem(key), key.dtype, budget, progress, options.seed,
                            began=began)  # fmt: skip
    task = _task(key, backend, options)
    native = strategy == backend.native_strategy
    workdir = (options.workdir or default_workdir()) if native else None  # refused before a line
    emit(f"with {strategy} ({backend.budget_text(budget) if native else budget.text()})")
    deadline = None if budget.seconds is None else began + budget.seconds
    # the native search runs before the workers start: they would share its cores
    found = None if workdir is None else search_native(backend, request, workdir, harness is None)
    with contextlib.ExitStack() as stack:
        if harness is None:
            harness = stack.enter_context(Harness(workers=options.workers,
                                                  run_timeout=options.run_timeout))  # fmt: skip
        bench = harness.benchmarker(task)
        if found is None:
            found = search_space(
                backend, request, bench, strategy=strategy, seed=options.seed,
                warm_start=options.warm_start, emit=emit,
                neighbours=(lambda space: neighbour_configs(cache, key, space)) if cache else None,
                prior_of=(lambda space: neighbour_prior(cache, key, space)) if cache else None,
            )  # fmt: skip
        default = unrefused(default_config(workload, key), options.refused, key)
        found = servable(found, key, default, options.refused)
        winner = select_winner(bench, found, default=default, seeds=options.seeds, emit=emit,
                               deadline=deadline)  # fmt: skip
        if isinstance(bench, Pipelines):
            emit(f"compiled ahead in the compile farm ({harness.farm.workers} processes); "
                 f"{bench.timer_compiles} compiles in the timing process")  # fmt: skip
    seconds = time.monotonic() - began
    record = build_record(key, backend, strategy, found, winner, seconds)
    emit(_done(found, winner, key.backend), phase="done")
    return TuneOutcome(key, record, winner.rejected, [*found.trials, *winner.trials],
                       timer_compiles=bench.timer_compiles)  # fmt: skip


def _task(key: Key, backend: Backend, options: TuneOptions) -> Task:
    """What the measurement workers set up for ``key``."""
    return Task(backend=options.backend_ref or backend.name, workload=key.kernel,
                problem=dict(key.problem), dtype=key.dtype, device=key.device.kind,
                timer=options.timer, timer_ref=options.timer_ref,
                target=compile_target(backend) if options.compile_ahead else None)  # fmt: skip


def _done(found: SearchResult, winner: Winner, backend: str) -> str:
    """The last progress line: the winner's time, beside its own quick timing in the search (the
    search's fastest was another config when the default or a runner-up won: shown beside the
    winner's time, it read as the winner's)."""
    searched = [t.time_ms for t in found.trials if t.time_ms is not None]
    own = [t.time_ms for t in found.trials if t.time_ms is not None and t.config == winner.config]
    said = (search_times.note(found.strategy, backend, searched, winner.timing.median_ms,
                              "{:.4g}".format)
            if found.strategy in search_times.COMPILER_TIMED else None)  # fmt: skip
    quick = (f"; {said}" if said else
             f"; its quick timing in the search was {min(own):.4g} ms" if own else
             f"; the search's fastest quick timing, {min(searched):.4g} ms, was another "
             "config's" if searched else "")  # fmt: skip
    # How it was re-timed as the record says it (samples of batched calls: "median of 3000",
    # the calls, read as 3000 samples).
    return (f"{winner.timing.median_ms:.4g} ms (re-timed: {winner.timing.timer}{quick}), validated "
            f"(max error {winner.report.max_rel_error:.2e})")  # fmt: skip


def build_record(
    key: Key, backend: Backend, strategy: str, found: SearchResult, winner: Winner, seconds: float
) -> RecordCreate:
    """The record of a finished run: winner, timings, validation, search and its trials (every
    one, up to what a record holds: :func:`recorded`)."""
    trials = [*found.trials, *winner.trials]
    return RecordCreate(
        key=KeyModel.from_key(key),
        config=winner.config,
        config_summary=backend.summarize(winner.config)[:256],
        timing=winner.timing,
        baselines=winner.baselines,
        validation=winner.report,
        search=SearchModel(strategy=strategy, trials=len(trials), seconds=round(seconds, 3)),
        trials=recorded(found.trials, winner.trials),
        provenance=Provenance(
            machine=platform.node(), tool_version=__version__, device_raw_name=key.device.raw_name
        ),
    )


def recorded(searched: list[Trial], after: list[Trial]) -> list[Trial]:
    """The trials a record holds: the search's and those after it (re-timings, rejections), or,
    past :data:`~tunecache.schemas.MAX_TRIALS` trials or
    :data:`~tunecache.schemas.MAX_TRIALS_BYTES` of their JSON, those after it and the search's
    fastest that fit, in the order they ran (a landscape of a larger space, a daemon's job of more
    trials, MetaSchedule's traces: a record of them all was refused after the whole search);
    ``search.trials`` still counts every one."""
    trials = [*searched, *after]
    sizes = [_bytes(t) for t in trials]
    if len(trials) <= MAX_TRIALS and sum(sizes) <= MAX_TRIALS_BYTES:
        return trials
    times = [trial_time(t) for t in searched]
    fastest = sorted(range(len(searched)), key=lambda i: (times[i] is None, times[i] or 0.0))
    first = [*range(len(searched), len(trials)), *fastest]  # those after it, then the fastest
    return [trials[i] for i in sorted(_fitting(sizes, first, MAX_TRIALS, MAX_TRIALS_BYTES))]


def _bytes(trial: Trial) -> int:
    """Bytes of ``trial`` in a record's JSON, as UTF-8 (an error of 2,048 characters not ASCII
    is up to three times as many bytes: counted in characters, a record past the server's body
    limit was kept whole), and its comma."""
    return len(trial.model_dump_json().encode()) + 1


def _fitting(sizes: list[int], order: Iterable[int], count: int, room: int) -> list[int]:
    """The indices, taken in ``order``, of at most ``count`` items whose ``sizes`` fit ``room``
    (one that does not fit is skipped, a smaller one after it may)."""
    kept: list[int] = []
    for i in order:
        if len(kept) >= count:
            break
        if sizes[i] <= room:
            kept.append(i)
            room -= sizes[i]
    return kept
