"""Checking a tuning record from the server before MetaSchedule sees it.

Whatever the server returns is untrusted (a broken or hostile server, a teammate's bug, a write
token in the wrong hands). A value reaches MetaSchedule only when it passes the closed schema of
``tvm.record`` values (:func:`tunecache.configcheck.tvm.record_value_problem`: plain data, a
finite mean run time, a trace of allowlisted instructions and annotations, so nothing in it can
bring code into the build), its argument info is exactly the workload's (the shapes and dtypes
of the function's parameters), TVM parses it against *this* workload (which replays the trace on
the module) and the parsed trace replays once more on a fresh schedule of the module.
So a trace recorded for another workload is dropped here, in Python, instead of failing inside
``compile_tir``'s C++ ``QuerySchedule``. A replayed schedule whose vectorized loops are wider than
:data:`MAX_LANES` is dropped too (:func:`vector_problem`): its build would raise or kill the
process.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tunecache.configcheck.tvm import record_value_problem

if TYPE_CHECKING:
    from tvm.ir import IRModule
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

logger = logging.getLogger(__name__)

# Lanes a block's vectorized loops may hold: MetaSchedule vectorizes up to 64 on llvm by default
# (ParallelizeVectorizeUnroll); TVM's build raises at 32768 and dies at 65536.
MAX_LANES = 1024


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
    schedule = Schedule(workload.mod)
    try:
        record.trace.apply_to_schedule(schedule, remove_postproc=False)
        problem = vector_problem(schedule)
    except Exception as exc:
        return None, f"its trace does not replay on this workload: {_last_line(exc)}"
    return (None, problem) if problem else (record, "")


def vector_problem(schedule: Any) -> str | None:
    """Why the vectorized loops of a replayed ``schedule`` may not be built, or ``None``: each
    block's vectorized loops together hold at most :data:`MAX_LANES` lanes, a constant. A served
    ``Split`` by 65536 and a ``Vectorize`` made TVM's build kill the process (SIGFPE), 32768 made
    it raise; the trace's instructions are each allowed, their product is not."""
    for function in schedule.mod.get_global_vars():
        for block in _blocks(schedule, schedule.get_sblock("root", func_name=function.name_hint)):
            lanes = _lanes(schedule, block)
            if lanes is None or lanes > MAX_LANES:
                wide = "a vectorized loop of no constant extent" if lanes is None \
                    else f"{lanes} vectorized lanes, more than {MAX_LANES}"  # fmt: skip
                return f"block {schedule.get(block).name_hint} has {wide}"
    return None


def _lanes(schedule: Any, block: Any) -> int | None:
    """The lanes of ``block``'s vectorized loops (1: none), ``None`` when one is not constant."""
    from tvm.tirx.stmt import ForKind

    lanes = 1
    for loop in schedule.get_loops(block):
        node = schedule.get(loop)
        if node.kind == ForKind.VECTORIZED:
            extent = getattr(node.extent, "value", None)  # an IntImm's; a variable has none
            if not isinstance(extent, int):
                return None
            lanes *= extent
    return lanes


def _blocks(schedule: Any, block: Any) -> Iterator[Any]:
    """The blocks below ``block``, at any depth."""
    for child in schedule.get_child_blocks(block):
        yield child
        yield from _blocks(schedule, child)


def _last_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]
