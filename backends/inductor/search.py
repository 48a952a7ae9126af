"""The max-autotune search: one observed compile, then the pinned candidates re-timed end to end.

1. Compile the workload once with max-autotune and freezing (caches off) while a
   :class:`~backends.inductor.observe.ChoiceObserver` records every choice Inductor benchmarks.
   Each choice is one trial, timed by Inductor's own benchmark of that kernel alone.
2. Where an op's choices come from distinct GEMM backends (CPU: ``_mkl_linear`` is ``ATEN``, the
   C++ template is ``CPP``), each can be rebuilt alone by pinning ``max_autotune_gemm_backends``.
   The top few are then compiled pinned and timed end to end, interleaved over a few rounds (the
   minimum of the per-round medians). The winner is the fastest end to end: it includes what
   Inductor's kernel-only benchmark leaves out (a fused epilogue, the wrapper) and survives a
   benchmark window in which another process held a core. ``retimed`` records those times.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends.base import Budget, Progress, ProgressFn, SearchResult, Trial
from backends.inductor.observe import AutotunedOp, ChoiceObserver, other_load
from backends.inductor.options import MODE_MAX_AUTOTUNE
from backends.inductor.runnable import InductorRunnable, default_frozen_inputs
from tunecache import conditions
from tunecache.errors import TuningError, one_line
from tunecache.timing import TimerSettings, time_cpu

if TYPE_CHECKING:
    import torch

    from workloads.base import Workload

logger = logging.getLogger(__name__)

STRATEGY = "inductor_max_autotune"
FUSED_CHOICE = "fused-cpp"  # no op was autotuned: the code Inductor generates under these settings
MAX_RETIMED = 3  # pinned candidates re-timed end to end (fewer if the budget allows fewer trials)
RETIME_ROUNDS = 5
RETIME_TIMER = TimerSettings(warmup=2, min_repeats=10, max_repeats=50, target_s=0.04)


def ms_or_none(value: float) -> float | None:
    """``value`` rounded for JSON, or ``None`` for inf/NaN (JSON has no infinity)."""
    return round(value, 6) if math.isfinite(value) else None


def _from_ops(base: dict[str, Any], ops: list[AutotunedOp]) -> SearchResult:
    """The search's result for the autotuned ``ops``: its trials and the configs, the best
    first (Inductor's order)."""
    if not ops:
        return SearchResult([{**base, "choice": FUSED_CHOICE}], [], STRATEGY)
    trials: list[Trial] = []
    for op in ops:
        for c in op.choices:
            trial_config = {**base, "op": op.op, "choice": c.name, "backend": c.backend}
            if math.isfinite(c.ms):
                trials.append(Trial(config=trial_config, status="ok", time_ms=c.ms))
            else:
                error = "Inductor's benchmark returned inf (the choice failed)"
                trials.append(Trial(config=trial_config, status="runtime_error", error=error))
    if len(ops) > 1:  # several autotuned ops: record them all, pin nothing
        winners = [op.winner.name if op.winner else "none" for op in ops]
        choices = {f"{op.op}/{c.name}": ms_or_none(c.ms) for op in ops for c in op.choices}
        return SearchResult([{**base, "choice": ", ".join(winners), "choices": choices}], trials,
                            STRATEGY)  # fmt: skip
    op = ops[0]
    choices = {c.name: ms_or_none(c.ms) for c in op.choices}
    configs: list[dict[str, Any]] = []
    for c in op.choices:  # fastest first
        if not math.isfinite(c.ms):
            continue
        config: dict[str, Any] = {**base, "op": op.op, "choice": c.name}
        # Pin the backend only where it names this choice alone; else a rebuild re-benchmarks.
        if c.backend is not None and sum(o.backend == c.backend for o in op.choices) == 1:
            config["backend"] = c.backend
        config["choices"] = choices
        configs.append(config)
    if not configs:
        configs = [{**base, "op": op.op, "choice": "none", "choices": choices}]
    return SearchResult(configs, trials, STRATEGY)


def _retime(
    candidates: list[tuple[dict[str, Any], InductorRunnable]],
    inputs: tuple[torch.Tensor, ...],
) -> list[float]:
    """End-to-end ms of each compiled candidate: min over interleaved rounds of short medians."""
    best = [math.inf] * len(candidates)
    for _ in range(RETIME_ROUNDS):
        for i, (_config, runnable) in enumerate(candidates):
            ms = time_cpu(partial(runnable, *inputs), RETIME_TIMER).median_ms
            best[i] = min(best[i], ms)
    return best


def run_search(
    workload: Workload,
    problem: Mapping[str, int],
    dtype: str,
    budget: Budget,
    workdir: Path,
    progress: ProgressFn | None,
    fallback: Callable[[], dict[str, Any]],
) -> SearchResult:
    """The search :meth:`InductorBackend.search` runs (see the module docstring).

    ``budget.trials`` caps how many pinned candidates are re-timed (1: none, Inductor's pick
    stands); ``budget.seconds`` is not enforced, the search being one compile plus at most
    :data:`MAX_RETIMED` pinned ones. ``fallback`` gives the config returned when the compile fails.

    Raises:
        TuningError: ``torch_fn`` itself raises on the problem's inputs (run eagerly once the
            compile failed): the message names the kernel and what it raised.
    """
    started, machine = time.perf_counter(), conditions.snapshot(family=True)
    inputs = workload.make_inputs(problem, dtype, seed=0)
    frozen = default_frozen_inputs(workload, len(inputs))
    base: dict[str, Any] = {"mode": MODE_MAX_AUTOTUNE, "freezing": True, "frozen": list(frozen)}
    runnable = InductorRunnable(workload.torch_fn, base, frozen, label=workload.name)
    observer = ChoiceObserver()
    if progress is not None:
        progress(Progress(0, 2, None, "compiling with max-autotune and freezing"))
    try:
        with observer.installed():
            runnable(*inputs)
    except Exception as exc:  # Inductor fails in many ways; the trial records it
        trial = _compile_error(workload.name, runnable, base, exc)
        return SearchResult([fallback()], [trial], STRATEGY, time.perf_counter() - started)
    compiled_s = time.perf_counter() - started
    ops = [op for op in observer.ops if op.choices]
    outcome = _from_ops(base, ops)
    pinned = [c for c in outcome.ranked if "backend" in c]
    pinned = pinned[: min(MAX_RETIMED, budget.trials)]
    retiming = len(pinned) >= 2 and pinned[0] is outcome.config
    if progress is not None:
        best = min((t.time_ms for t in outcome.trials if t.time_ms is not None), default=None)
        step = f"; re-timing {len(pinned)} pinned choices end to end" if retiming else ""
        message = f"compiled in {compiled_s:.1f} s, {len(outcome.trials)} choices benchmarked"
        progress(Progress(1, 2, best, message + step))
    if retiming:
        runnable, compiled_ms = _pick_retimed(workload, inputs, frozen, runnable, outcome, pinned)
    else:
        compiled_ms = _retime([(outcome.config, runnable)], inputs)[0]
    if not ops:
        outcome.trials = [Trial(config=outcome.config, status="ok", time_ms=compiled_ms)]
    runnable.config = dict(outcome.config)  # later weight sets compile pinned to the winner
    message = f"{summarize_config(outcome.config)}; compiled call {compiled_ms:.4g} ms"
    logger.info("%s %s: %s (compile %.1f s, search %.1f s)", workload.name, dict(problem),
                message, compiled_s, time.perf_counter() - started)  # fmt: skip
    _finished(outcome, message, progress, machine)
    _write_log(workdir, workload.name, problem, dtype, outcome.config, ops, compiled_ms)
    outcome.seconds, outcome.runnable = time.perf_counter() - started, runnable
    return outcome


def _compile_error(name: str, runnable: InductorRunnable, config: dict[str, Any],
                   exc: Exception) -> Trial:  # fmt: skip
    """The failed compile ``exc`` of ``runnable`` as a ``compile_error`` trial, logged on one
    line (the traceback at DEBUG, ``-v``).

    Raises:
        TuningError: ``exc`` is what ``torch_fn`` itself raised (no config can pass), named.
    """
    if exc is runnable.torch_fn_error:  # its traceback logged at DEBUG by the runnable
        raise TuningError(f"{name}: torch_fn raised {one_line(exc)}") from exc
    logger.warning("inductor compile of %s failed: %s", name, one_line(exc))
    logger.debug("inductor compile of %s failed", name, exc_info=exc)
    return Trial(config=config, status="compile_error", error=f"{type(exc).__name__}: {exc}"[:2000])


def _finished(outcome: SearchResult, message: str, progress: ProgressFn | None,
              since: conditions.Snapshot) -> None:  # fmt: skip
    """Warns when other processes loaded the cores since ``since``, and reports the search as
    done."""
    if (extra := other_load(since)) is not None:
        logger.warning(
            "other processes kept about %.1f cores busy during the search: CPU timings may "
            "include their stalls",
            extra,
        )
    if progress is not None:
        best = min((t.time_ms for t in outcome.trials if t.time_ms is not None), default=None)
        progress(Progress(2, 2, best, message))


def _pick_retimed(
    workload: Workload,
    inputs: tuple[torch.Tensor, ...],
    frozen: tuple[int, ...],
    searched: InductorRunnable,
    outcome: SearchResult,
    pinned: list[dict[str, Any]],
) -> tuple[InductorRunnable, float]:
    """Compiles the pinned runners-up, re-times all, reorders ``outcome``; returns the winner."""
    candidates: list[tuple[dict[str, Any], InductorRunnable]] = [(pinned[0], searched)]
    for config in pinned[1:]:
        other = InductorRunnable(workload.torch_fn, config, frozen, label=workload.name)
        try:
            other(*inputs)
        except Exception as exc:  # a pinned rebuild that fails is dropped, not fatal
            logger.warning("pinned rebuild %s failed: %s", config.get("choice"), one_line(exc))
            logger.debug("pinned rebuild %s failed", config.get("choice"), exc_info=True)
            continue
        candidates.append((config, other))
    times = _retime(candidates, inputs)
    retimed = {c["choice"]: ms_or_none(ms) for (c, _), ms in zip(candidates, times, strict=True)}
    order = sorted(range(len(candidates)), key=lambda i: times[i])
    ranked_pinned = [{**candidates[i][0], "retimed": retimed} for i in order]
    rest = [c for c in outcome.ranked if all(c is not p for p, _ in candidates)]
    if ranked_pinned[0]["choice"] != outcome.config["choice"]:
        logger.info(
            "re-timed end to end, %s beats Inductor's pick %s: %s",
            ranked_pinned[0]["choice"],
            outcome.config["choice"],
            retimed,
        )
        ranked_pinned[0]["inductor_choice"] = outcome.config["choice"]
    outcome.ranked = ranked_pinned + rest
    return candidates[order[0]][1], times[order[0]]


def summarize_config(config: Mapping[str, Any]) -> str:
    """``default``, or ``max-autotune: cpp_CppMicroGemmFP32Vec (0.0098 ms) of 2 choices``.

    The time is the end-to-end re-time where there is one, else Inductor's kernel benchmark.
    """
    mode = config.get("mode")
    if mode != MODE_MAX_AUTOTUNE:
        return str(mode or json.dumps(dict(config), sort_keys=True))
    choice = str(config.get("choice", "?"))
    choices = config.get("choices")
    if isinstance(choices, Mapping) and choices:
        retimed = config.get("retimed")
        ms = retimed.get(choice) if isinstance(retimed, Mapping) else choices.get(choice)
        timed = f" ({ms:.3g} ms)" if isinstance(ms, int | float) else ""
        return f"max-autotune: {choice}{timed} of {len(choices)} choices"
    frozen = ", frozen weights" if config.get("freezing") and config.get("frozen") else ""
    return f"max-autotune: {choice}{frozen}"


def _write_log(
    workdir: Path,
    workload: str,
    problem: Mapping[str, int],
    dtype: str,
    config: Mapping[str, Any],
    ops: list[AutotunedOp],
    compiled_ms: float,
) -> None:
    """Leaves the search's findings in ``workdir/inductor_search.json`` (best effort)."""
    record = {
        "workload": workload,
        "problem": dict(problem),
        "dtype": dtype,
        "config": dict(config),
        "compiled_call_ms": ms_or_none(compiled_ms),
        "ops": [
            {"op": op.op, "choices": [[c.name, c.backend, ms_or_none(c.ms)] for c in op.choices]}
            for op in ops
        ],
    }
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "inductor_search.json").write_text(json.dumps(record, indent=1))
    except OSError as exc:
        logger.debug("could not write the search log to %s: %s", workdir, exc)
