"""MetaSchedule traces as JSON configs: capture, replay on any problem size, summarise.

A tuned config is ``{"schedule": "meta_schedule", "trace": <Trace.as_json()>, "target": {...}}``:
plain JSON, rebuilt in any process by replaying the trace on a freshly created PrimFunc.
``SamplePerfectTile`` decisions that no longer divide a loop (an edge problem with odd sizes)
are re-sampled by TVM during replay, so a trace tuned at 128 also schedules 127.

Importing this module imports no TVM (which takes seconds): a record's summary
(:func:`summarize_trace`, what ``tunecache get`` shows) and its checks need none.

A trace is replayed only when it passes the allowlist of
:func:`tunecache.configcheck.tvm_trace.trace_problem` (MetaSchedule's own instructions and
annotation keys): an instruction or annotation that could bring code into the build, such as
``pragma_import_llvm``, is refused before TVM sees the trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tunecache.configcheck.tvm_trace import trace_problem
from tunecache.errors import InvalidInput, TuningError

if TYPE_CHECKING:
    from tvm.s_tir import Schedule
    from tvm.tirx import PrimFunc

SCHEDULE_DEFAULT = "default"
SCHEDULE_META = "meta_schedule"
_SUMMARY_LIMIT = 60
_MAX_ERROR = 2000


def trace_json(trace: Any) -> list[Any]:
    """A MetaSchedule ``Trace`` as plain JSON data (instructions and decisions)."""
    from tunecache.tvm.jsonutil import plain_json  # tunecache.tvm imports TVM (seconds)

    data: list[Any] = plain_json(trace.as_json())
    return data


def config_schedule(config: Mapping[str, Any]) -> str:
    """The ``schedule`` kind of a TVM config.

    Raises:
        InvalidInput: the config is not a TVM config, or a meta_schedule config has no trace or
            one outside the allowlist (the message names the instruction and the reason).
    """
    kind = config.get("schedule")
    if kind == SCHEDULE_DEFAULT:
        return kind
    if kind == SCHEDULE_META:
        trace = config.get("trace")
        if not isinstance(trace, list) or len(trace) != 2:
            raise InvalidInput("a meta_schedule config needs 'trace': [instructions, decisions]")
        check_trace(trace)
        return kind
    raise InvalidInput(
        f"unknown TVM schedule {kind!r}; expected {SCHEDULE_DEFAULT!r} or {SCHEDULE_META!r}"
    )


def check_trace(trace: Any) -> None:
    """Checks ``trace`` against the allowlist of what MetaSchedule's search spaces produce.

    Raises:
        InvalidInput: an instruction, attribute or annotation is not allowed (named).
    """
    if (why := trace_problem(trace)) is not None:
        raise InvalidInput(f"the MetaSchedule trace is refused: {why}")


def apply_trace(func: PrimFunc, trace: list[Any], *, where: str = "") -> Schedule:
    """A schedule of ``func`` with the instructions of ``trace`` replayed on it.

    Raises:
        InvalidInput: the trace is outside the allowlist (:func:`check_trace`), TVM never sees
            it; or, replayed, it vectorizes a block wider than a build takes or pads a block's
            loops far past its iteration space (:func:`tunecache.tvm.check.replayed_problem`).
        TuningError: an instruction cannot be replayed on this function (another problem size
            made a block, loop or decision invalid); the message names the instruction.
    """
    check_trace(trace)
    from tvm.s_tir import Schedule
    from tvm.s_tir.schedule import Trace

    from tunecache.tvm.check import replayed_problem

    sch = Schedule(func)
    try:
        Trace.apply_json_to_schedule(trace, sch)
    except Exception as exc:
        raise TuningError(
            f"the MetaSchedule trace cannot be replayed{where}: {_failing_instruction(func, trace)}"
            f": {_short(exc)} (tile decisions that no longer divide a loop are re-sampled, and"
            " this one changed the loop nest the rest of the trace expects; use another config"
            " or tune at this size)"
        ) from exc
    if (why := replayed_problem(sch, func)) is not None:  # its build would fail, or its run hang
        raise InvalidInput(f"the MetaSchedule trace is refused{where}: {why}")
    return sch


def _failing_instruction(func: PrimFunc, trace: list[Any]) -> str:
    """``instruction #i Name(inputs)``: the first instruction whose replay fails (bisected)."""
    from tvm.s_tir import Schedule
    from tvm.s_tir.schedule import Trace

    try:
        insts, decisions = trace
        low, high = 0, len(insts)  # the prefix of `low` replays; that of `high` fails
        while high - low > 1:
            mid = (low + high) // 2
            prefix = [insts[:mid], [d for d in decisions if int(d[0]) < mid]]
            try:
                Trace.apply_json_to_schedule(prefix, Schedule(func))
                low = mid
            except Exception:
                high = mid
        kind, inputs = insts[high - 1][0], insts[high - 1][1]
        return f"instruction #{high - 1} {kind}({', '.join(map(str, inputs))})"[:200]
    except (ValueError, TypeError, IndexError):
        return "an instruction"


def summarize_trace(trace: list[Any]) -> str:
    """Tile decisions and the unroll choice, e.g. ``tiles 1x8x2x4/1x1x64x1 k32x2 unroll 16``."""
    try:
        insts, decisions = trace
        by_index = {int(i): d for i, d in decisions}
        tiles: list[str] = []
        unroll: list[str] = []
        post = {"Parallel": 0, "Vectorize": 0}
        for index, inst in enumerate(insts):
            name = inst[0]
            if name == "SamplePerfectTile" and index in by_index:
                tiles.append("x".join(str(int(v)) for v in by_index[index]))
            elif name == "SampleCategorical" and index in by_index:
                candidates = inst[2][0]
                unroll.append(str(candidates[int(by_index[index])]))
            elif name in post:
                post[name] += 1
    except (ValueError, TypeError, IndexError, KeyError):
        return "meta_schedule (unreadable trace)"
    parts = []
    if tiles:
        parts.append("tiles " + "/".join(tiles))
    if unroll:
        parts.append("unroll " + "/".join(unroll))
    if post["Parallel"]:
        parts.append("par")
    if post["Vectorize"]:
        parts.append("vec")
    text = " ".join(parts) or "meta_schedule (no tiling)"
    return text if len(text) <= _SUMMARY_LIMIT else text[: _SUMMARY_LIMIT - 1] + "…"


def _short(exc: BaseException) -> str:
    """The useful part of a TVM error: its last non-empty lines, at most 2000 characters."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    text = "\n".join(lines[-6:]) if lines else type(exc).__name__
    return text[-_MAX_ERROR:]
