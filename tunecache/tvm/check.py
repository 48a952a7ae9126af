"""Checking a tuning record from the server before MetaSchedule sees it.

Whatever the server returns is untrusted (a broken or hostile server, a teammate's bug, a write
token in the wrong hands). A value reaches MetaSchedule only when it passes the closed schema of
``tvm.record`` values (:func:`tunecache.configcheck.tvm.record_value_problem`: plain data, a
finite mean run time, a trace of allowlisted instructions and annotations, so nothing in it can
bring code into the build), its argument info is exactly the workload's (the shapes and dtypes
of the function's parameters), TVM parses it against *this* workload (which replays the trace on
the module) and the parsed trace replays once more on a fresh schedule of the module.
So a trace recorded for another workload is dropped here, in Python, instead of failing inside
``compile_tir``'s C++ ``QuerySchedule``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tunecache.configcheck.tvm import record_value_problem

if TYPE_CHECKING:
    from tvm.ir import IRModule
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

logger = logging.getLogger(__name__)


def args_info_json(mod: IRModule) -> list[Any]:
    """The argument info MetaSchedule records for ``mod``'s entry function, as plain JSON."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    return [info.as_json() for info in ArgInfo.from_entry_func(mod, remove_preproc=True)]


def check_record(
    value: Any, workload: Workload, expected_args: list[Any], device: str = "cpu"
) -> tuple[TuningRecord | None, str]:
    """``(record, "")`` when ``value`` is a usable record of ``workload`` for a target of
    ``device`` (``cpu``: llvm; ``cuda``), else ``(None, why)``.

    Never raises: every failure, TVM's included, is a reason.
    """
    # Plain data of allowlisted instructions only, for this database's device, whatever target
    # the record itself names.
    problem = record_value_problem(value, device)
    if problem is not None:
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


def _last_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]
