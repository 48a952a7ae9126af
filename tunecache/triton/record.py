"""What a local Triton autotuning run becomes in the cache: a validated record.

The winner is checked on fresh inputs against ``reference`` (a function computing the outputs in
place, as the kernel does) or, without one, against the first listed config's output, in the
kernel's own dtype; only a winner that passes is stored, and its ``validation.reference`` says
which of the two it was compared with, in which dtype (no float64 reference is computed here).
A record carries only the trials Triton measured for its own key.
"""

from __future__ import annotations

import math
import platform
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tunecache import __version__
from tunecache.key import Key
from tunecache.schemas import (
    BaselineModel,
    CheckModel,
    KeyModel,
    Provenance,
    RecordCreate,
    SearchModel,
    TimingModel,
    Trial,
    ValidationReport,
)


def config_json(config: Any) -> dict[str, Any]:
    """A ``triton.Config`` as flat JSON: its meta-parameters and launch options."""
    launch = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    if getattr(config, "num_ctas", 1) != 1:
        launch["num_ctas"] = config.num_ctas
    if getattr(config, "maxnreg", None) is not None:
        launch["maxnreg"] = config.maxnreg
    return {**dict(config.kwargs), **launch}


DO_BENCH_TIMER = "triton do_bench (median, p20, p80)"
# A do_bench answer of one number (a user's bench, or quantiles not asked for): a median alone.
MEDIAN_TIMER = "triton do_bench (median)"


def timing_of(timings: Any, timer: str = DO_BENCH_TIMER) -> TimingModel | None:
    """Triton's ``do_bench`` answer as a timing, if sane; ``timer`` says what measured it.

    A list or tuple is (median, 20th, 80th percentile) ms, the range between the two stored as
    its ``iqr_ms`` too (wider than the quartiles': a spread the noise check reads, where none
    stored let the interpreter's 24-56 ms around 35 ms pass as quiet); a single number is a
    median with no spread measured (min = max = median), and a timer claiming those percentiles
    then says :data:`MEDIAN_TIMER` instead."""
    single = not isinstance(timings, list | tuple)
    values = [timings] * 3 if single else list(timings)
    if len(values) < 3 or not all(isinstance(v, int | float) and math.isfinite(v) and v > 0
                                  for v in values[:3]):  # fmt: skip
        return None
    median, low, high = (float(v) for v in values[:3])
    if single and timer == DO_BENCH_TIMER:
        timer = MEDIAN_TIMER
    low, high = min(low, median), max(high, median)
    return TimingModel(median_ms=median, min_ms=low, max_ms=high, iqr_ms=high - low, repeats=1,
                       timer=timer)  # fmt: skip


def reference_label(user_reference: bool, dtype: str, outputs: list[str] | None = None) -> str:
    """What a check compared with, in which dtype, and which outputs where ``outputs=`` named
    them (a reader comparing every output must see that this check did not):
    ``"the first listed config, float16"``, ``"reference= (user function), float16, outputs
    y_ptr"``."""
    against = "reference= (user function)" if user_reference else "the first listed config"
    named = f", outputs {' '.join(outputs)}" if outputs is not None else ""
    return f"{against}, {dtype}{named}"


def validated(check: CheckModel, reference: str) -> ValidationReport:
    """The validation of a record whose one check is ``check``, against ``reference``
    (:func:`reference_label`)."""
    return ValidationReport(passed=check.passed, tolerance=check.tolerance,
                            max_rel_error=check.rel_error, checks=[check],
                            reference=reference[:128])  # fmt: skip


def build_record(
    key: Key,
    winner: Any,
    timings: Mapping[Any, Any],
    default: Any,
    report: ValidationReport,
    seconds: float,
    summary: Callable[[dict[str, Any]], str] | None = None,
    timer: str = DO_BENCH_TIMER,
    marks: Sequence[tuple[Any, str, str]] = (),
) -> RecordCreate | None:
    """The record of a local autotuning run, or ``None`` when its timings are unusable;
    ``timer``: what measured them; ``marks``: (config, status, why) for configs a check judged
    (:func:`tunecache.triton.fallback.reasons`): ``wrong_answer`` trials have no time (a faster
    wrong config is no winner, nor a baseline); ``ok`` ones keep theirs and say ``why``.

    ``timings`` must be the ones measured for ``key`` (Triton leaves an earlier key's in place
    when it launches without benchmarking): every entry becomes a trial of this record.
    """
    timing = timing_of(timings.get(winner), timer)
    if timing is None:
        return None
    trials = []
    for config, measured in timings.items():
        t = timing_of(measured, timer)
        status, why = next(((s, w) for c, s, w in marks if c is config), ("ok", ""))
        if status == "wrong_answer":
            trials.append(Trial(config=config_json(config), status="wrong_answer", error=why))
        elif t is None:
            trials.append(Trial(config=config_json(config), status="runtime_error",
                                error="no usable timing (failed to compile or run)"))  # fmt: skip
        else:
            trials.append(Trial(config=config_json(config), status="ok", time_ms=t.median_ms,
                                error=why))  # fmt: skip
    baselines = []
    if any(c is default and s == "wrong_answer" for c, s, _ in marks):
        pass  # a wrong default is no baseline: "2.00x slower than the default config"
    elif (default_timing := timing_of(timings.get(default), timer)) is not None:
        baselines.append(BaselineModel(name="default_config", timing=default_timing))
    chosen = config_json(winner)
    label = summary(chosen) if summary else " ".join(f"{k}={v}" for k, v in chosen.items())
    return RecordCreate(
        key=KeyModel.from_key(key), config=chosen, config_summary=label[:256],
        timing=timing, baselines=baselines, validation=report,
        search=SearchModel(strategy="triton_autotune", trials=len(trials),
                           seconds=round(max(seconds, 0.0), 3)),
        trials=trials,
        provenance=Provenance(machine=platform.node(), tool_version=__version__,
                              device_raw_name=key.device.raw_name),
    )  # fmt: skip
