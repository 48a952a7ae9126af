"""The closed schema of TVM configs and MetaSchedule records: scheduling decisions, never code.

Configs (:func:`config_problem`) are ``{"schedule": "default"}``, a knob config of plain named
integers and flags, or ``{"schedule": "meta_schedule", "trace": ..., "target": {...}}`` whose
trace passes the allowlist of :mod:`tunecache.configcheck.tvm_trace` for the device the record
runs on. Artifacts are ``tvm.record`` values (:func:`record_value_problem`: ``[trace, run_secs,
target, args_info]``) and ``tvm.workload`` values (:func:`workload_value_problem`).

Nothing here imports TVM: the server runs these checks too.

Example:
    >>> config_problem({"schedule": "knobs", "tile_i": 8, "vectorize": True})
    >>> config_problem({"schedule": "knobs", "tile_i": "8; rm -rf /"})
    "knob tile_i='8; rm -rf /' is not a flag or an integer in 0..4096"
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, Final

from tunecache.configcheck.triton import strict_int
from tunecache.configcheck.tvm_trace import GPU_DEVICES, MAX_ITEMS, trace_problem, within_int64
from tunecache.problem import describe

SCHEDULES: Final = ("default", "knobs", "meta_schedule")
MAX_KNOBS: Final = 16
MAX_KNOB: Final = 4096
MAX_TARGET_KEYS: Final = 64
MAX_TARGET_TEXT: Final = 256
# A mean run time at or above this marks a candidate MetaSchedule could not build or run.
FAILED_SECONDS: Final = 1e9

_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_TARGET_KEY: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")
_HEX64: Final = re.compile(r"[0-9a-f]{64}")
# LLVM command-line options: a target attribute that could change any build it is used for.
_TARGET_REFUSED: Final = frozenset({"cl-opt"})


# -- configs and artifacts ----------------------------------------------------------------------
def target_problem(target: Any, depth: int = 0) -> str | None:
    """Why ``target`` is not a target object of plain bounded values, or ``None``."""
    if not isinstance(target, dict) or not 0 < len(target) <= MAX_TARGET_KEYS:
        return f"target {describe(target, 40)} is not an object of 1..{MAX_TARGET_KEYS} fields"
    if depth == 0 and not (isinstance(target.get("kind"), str) and _NAME.fullmatch(target["kind"])):
        return f"target kind {describe(target.get('kind'), 30)} is not a name"
    for key, value in target.items():
        if not isinstance(key, str) or not _TARGET_KEY.fullmatch(key) or key in _TARGET_REFUSED:
            return f"target field {describe(key, 40)} is not allowed"
        if isinstance(value, dict) and depth == 0 and key == "host":
            if (why := target_problem(value, depth + 1)) is not None:
                return f"target host: {why}"
            continue
        items = value if isinstance(value, list) and len(value) <= MAX_ITEMS else [value]
        if not all(_plain(v) for v in items):
            return f"target field {key}={describe(value, 40)} is not a plain bounded value"
    return None


def _plain(value: Any) -> bool:
    if isinstance(value, str):
        return len(value) <= MAX_TARGET_TEXT and value.isprintable()
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, bool) or (strict_int(value) and within_int64(value))


def _knob_problem(name: Any, value: Any) -> str | None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return f"{describe(name, 40)} is not a knob name"
    if isinstance(value, bool) or (strict_int(value) and 0 <= value <= MAX_KNOB):
        return None
    return f"knob {name}={describe(value, 30)} is not a flag or an integer in 0..{MAX_KNOB}"


def config_problem(config: Any, device: str = "cpu") -> str | None:
    """Why ``config`` is not a TVM config that may be served to run on ``device``, or ``None``.
    Built-in TVM records build for the host CPU whatever target they name."""
    if not isinstance(config, dict):
        return f"{describe(config, 40)} is not an object"
    schedule = config.get("schedule")
    if schedule not in SCHEDULES:
        return f"schedule={describe(schedule, 30)} is not one of {', '.join(SCHEDULES)}"
    rest = {k: v for k, v in config.items() if k != "schedule"}
    if schedule == "default":
        return f"{describe(next(iter(rest)))} is not a field of a default config" if rest else None
    if schedule == "knobs":
        if len(rest) > MAX_KNOBS:
            return f"{len(rest)} knobs, over {MAX_KNOBS}"
        return next((why for k, v in rest.items() if (why := _knob_problem(k, v))), None)
    extra = [k for k in rest if k not in ("trace", "target")]
    if extra:
        return f"{describe(extra[0])} is not a field of a meta_schedule config"
    if "trace" not in rest:
        return "a meta_schedule config needs a trace"
    if "target" in rest and (why := target_problem(rest["target"])) is not None:
        return why
    return trace_problem(rest["trace"], device)


def mean_seconds(run_secs: Any) -> float | None:
    """The mean of a record's run times, or ``None`` when it failed, was not run or is not data."""
    if not isinstance(run_secs, Sequence) or isinstance(run_secs, str) or not run_secs:
        return None
    values = []
    for v in run_secs:
        v = getattr(v, "value", v)  # a TVM FloatImm
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            return None
        values.append(float(v))
    mean = sum(values) / len(values)
    return None if mean >= FAILED_SECONDS else mean


def target_device(target: Any) -> str:
    """The device a target dict builds for: ``cuda`` or ``rocm`` by its kind, else ``cpu``."""
    kind = target.get("kind") if isinstance(target, dict) else None
    return kind if isinstance(kind, str) and kind in GPU_DEVICES else "cpu"


def record_value_problem(value: Any, device: str | None = None) -> str | None:
    """Why a ``tvm.record`` artifact's value (``[trace, run_secs, target, args_info]``, a
    ``TuningRecord``'s JSON) may not be stored or served for ``device`` (default: the device of
    the target it names), or ``None``."""
    if not isinstance(value, list) or len(value) != 4:
        return "not a [trace, run_secs, target, args_info] list"
    trace, run_secs, target, args = value
    if not within_int64(value):
        return "it holds an integer TVM cannot take (or is nested too deep)"
    if (why := trace_problem(trace, device or target_device(target))) is not None:
        return why
    if mean_seconds(run_secs) is None:
        return "its run times are missing, failed or not numbers"
    if target is not None and (why := target_problem(target)) is not None:
        return why
    if not isinstance(args, list) or len(args) > MAX_ITEMS:
        return "its argument info is not a list"
    for i, arg in enumerate(args):
        if not (isinstance(arg, list) and all(_plain(v) or _int_shape(v) for v in arg)):
            return f"args_info[{i}] is not a list of plain values"
    return None


def _int_shape(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= 64 and all(strict_int(v) for v in value)


def workload_value_problem(value: Any) -> str | None:
    """Why a ``tvm.workload`` artifact's value may not be stored, or ``None``: it is
    ``{"script_sha": <64 hex>, "mod": {...}}`` (what a key is, for people; never loaded)."""
    if not isinstance(value, dict) or set(value) != {"script_sha", "mod"}:
        return "not a {script_sha, mod} object"
    sha = value["script_sha"]
    if not (isinstance(sha, str) and _HEX64.fullmatch(sha)):
        return f"script_sha={describe(sha, 30)} is not 64 hex digits"
    if not isinstance(value["mod"], dict):
        return "mod is not an object"
    return None


__all__ = [
    "FAILED_SECONDS",
    "config_problem",
    "mean_seconds",
    "record_value_problem",
    "target_device",
    "target_problem",
    "trace_problem",
    "workload_value_problem",
]
