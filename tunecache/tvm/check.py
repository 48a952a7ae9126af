"""Checking a tuning record from the server before MetaSchedule sees it.

Whatever the server returns is untrusted (a broken or hostile server, a teammate's bug). A value
reaches MetaSchedule only when it is a ``[trace, run_secs, target, args_info]`` list of plain
data, its mean run time is finite, its argument info is exactly the workload's (the shapes and
dtypes of the function's parameters), TVM parses it against *this* workload (which replays the
trace on the module) and the parsed trace replays once more on a fresh schedule of the module.
So a trace recorded for another workload is dropped here, in Python, instead of failing inside
``compile_tir``'s C++ ``QuerySchedule``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tunecache.tvm.wire import mean_seconds

if TYPE_CHECKING:
    from tvm.ir import IRModule
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

logger = logging.getLogger(__name__)


def args_info_json(mod: IRModule) -> list[Any]:
    """The argument info MetaSchedule records for ``mod``'s entry function, as plain JSON."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    return [info.as_json() for info in ArgInfo.from_entry_func(mod, remove_preproc=True)]


def check_record(
    value: Any, workload: Workload, expected_args: list[Any]
) -> tuple[TuningRecord | None, str]:
    """``(record, "")`` when ``value`` is a usable record of ``workload``, else ``(None, why)``.

    Never raises: every failure, TVM's included, is a reason.
    """
    problem = _shape_problem(value)
    if problem:
        return None, problem
    if value[3] != expected_args:
        return None, "its argument info is not this workload's (a record of another workload)"
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.database import TuningRecord

    try:
        record = TuningRecord.from_json(value, workload)
    except Exception as exc:
        return None, f"TVM cannot read it for this workload: {_last_line(exc)}"
    try:
        record.trace.apply_to_schedule(Schedule(workload.mod), remove_postproc=False)
    except Exception as exc:
        return None, f"its trace does not replay on this workload: {_last_line(exc)}"
    return record, ""


def _shape_problem(value: Any) -> str:
    """What keeps ``value`` from being a record's JSON (empty when nothing does)."""
    if not isinstance(value, list) or len(value) != 4:
        return "not a [trace, run_secs, target, args_info] list"
    trace, run_secs, target, args = value
    if not _within_int64(value):
        return "it holds an integer TVM cannot take"
    problem = _trace_problem(trace)
    if problem:
        return problem
    if mean_seconds(run_secs) is None:
        return "its run times are missing, failed or not numbers"
    if target is not None and not isinstance(target, dict):
        return "its target is not an object"
    if not isinstance(args, list):
        return "its argument info is not a list"
    return ""


def _trace_problem(trace: Any) -> str:
    """What is wrong with a trace's ``[instructions, decisions]`` JSON that TVM does not check.

    TVM checks each instruction's kind and arity itself, but not everything: a decision's
    instruction index out of range writes outside its array, a zero tile factor divides by zero
    (crashes, not exceptions). Those are checked here.
    """
    if not (isinstance(trace, list) and len(trace) == 2 and _lists(trace)):
        return "its trace is not [instructions, decisions]"
    insts, decisions = trace
    for inst in insts:
        if not (isinstance(inst, list) and len(inst) == 4 and isinstance(inst[0], str)):
            return "an instruction is not [kind, inputs, attrs, outputs]"
        if not _lists(inst[1:]):
            return f"instruction {inst[0][:40]!r} has inputs, attrs or outputs that are not lists"
    seen: set[int] = set()
    for decision in decisions:
        if not (isinstance(decision, list) and len(decision) == 2):
            return "a decision is not [instruction index, value]"
        index = decision[0]
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(insts):
            return f"a decision names instruction {str(index)[:20]}, not one of the trace's"
        if index in seen:
            return f"two decisions for instruction {index}"
        seen.add(index)
        if not _decision_value(decision[1]):
            return f"the decision for instruction {index} is not an integer or positive tiles"
    return ""


def _decision_value(value: Any) -> bool:
    """An index (``SampleCategorical``, ``SampleComputeLocation``) or tile factors, all >= 1."""
    if isinstance(value, list):
        return all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    return isinstance(value, int) and not isinstance(value, bool)


def _within_int64(value: Any, depth: int = 0) -> bool:
    """Whether every integer in ``value`` fits TVM's int64 (and the nesting is sane)."""
    if depth > 32:
        return False
    if isinstance(value, bool) or not isinstance(value, int | list | dict):
        return True
    if isinstance(value, int):
        return -(2**63) <= value < 2**63
    items = value.values() if isinstance(value, dict) else value
    return all(_within_int64(v, depth + 1) for v in items)


def _lists(values: list[Any]) -> bool:
    return all(isinstance(v, list) for v in values)


def _last_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]
