"""Checking a tuning record from the server before MetaSchedule sees it.

Whatever the server returns is untrusted (a broken or hostile server, a teammate's bug, a write
token in the wrong hands). A value reaches MetaSchedule only when it passes the closed schema of
``tvm.record`` values (:func:`tunecache.configcheck.tvm.record_value_problem`: plain data, a
finite mean run time, a trace of allowlisted instructions and annotations, so nothing in it can
bring code into the build), its argument info is exactly the workload's (the shapes and dtypes
of the function's parameters), TVM parses it against *this* workload (which replays the trace on
the module) and the parsed trace replays once more on a fresh schedule of the module. A record
TVM had to invent a decision for as it read it (:func:`invented_problem`) is dropped: each
process would pick its own, and ranks would compute differently.
So a trace recorded for another workload is dropped here, in Python, instead of failing inside
``compile_tir``'s C++ ``QuerySchedule``. A replayed schedule whose vectorized loops are wider than
:data:`MAX_LANES` is dropped too (:func:`vector_problem`): its build would raise or kill the
process; so is one that pads a block's loops far past its iteration space
(:func:`work_problem`): its kernel would loop for hours behind its bounds check; and one that
places a block inside the loop of another block's reduction whose output it reads
(:func:`tunecache.tvm.partial.partial_problem`): TVM accepts it, and the kernel computes from
partial sums.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tunecache.configcheck.tvm import record_value_problem
from tunecache.tvm.partial import partial_problem

if TYPE_CHECKING:
    from tvm.ir import IRModule
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload
    from tvm.tirx import PrimFunc

logger = logging.getLogger(__name__)

# Lanes a block's vectorized loops may hold: MetaSchedule vectorizes up to 64 on llvm by default
# (ParallelizeVectorizeUnroll); TVM's build raises at 32768 and dies at 65536.
MAX_LANES = 1024
# How far a block's loops may walk (a split that does not divide its loop pads it, a bounds check
# skipping the rest): MAX_PADDING times the module's largest block, plus PADDING_ITERATIONS
# (about a millisecond of empty iterations); and the kernel, MAX_PADDING times the module's
# iterations times its longest loop. MetaSchedule's own spaces of the built-in workloads walk a
# block up to 37 times its own space (a CUDA tile of A copied for each thread block), none past
# these bounds (bench/tvm_work.py).
MAX_PADDING = 16
MAX_THREADS = 1024  # a CUDA thread block's; a loop bound to more threads is counted as serial
PADDING_ITERATIONS = 2**20


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
    if (problem := invented_problem(record.trace, value[0])) is not None:
        return None, problem
    schedule = Schedule(workload.mod)
    try:
        record.trace.apply_to_schedule(schedule, remove_postproc=False)
        problem = replayed_problem(schedule, workload.mod)
    except Exception as exc:
        return None, f"its trace does not replay on this workload: {_last_line(exc)}"
    return (None, problem) if problem else (record, "")


def invented_problem(trace: Any, served: list[Any]) -> str | None:
    """Why ``trace``, which TVM read from the ``[instructions, decisions]`` JSON ``served``,
    holds a decision ``served`` does not, or ``None``. TVM samples a sampling instruction's
    missing decision as it reads a record, anew in each process (seed -1): each rank of a job
    would build its own kernel (tiles before an ``RFactor``: sums in their own orders)."""
    if len(trace.decisions) <= len(served[1]):
        return None
    given = {decision[0] for decision in served[1]}
    where = next((f"instruction {i} ({inst.kind.name})" for i, inst in enumerate(trace.insts)
                  if inst in trace.decisions and i not in given), "an instruction")  # fmt: skip
    return (f"its {where} has no decision: TVM sampled one as it read the record (each "
            "process would pick its own)")  # fmt: skip


def replayed_problem(schedule: Any, original: IRModule | PrimFunc) -> str | None:
    """Why a trace replayed on ``original`` as ``schedule`` may not be built or run, or
    ``None``: :func:`partial_problem` (its result would be wrong), :func:`vector_problem`,
    then :func:`work_problem`."""
    return (partial_problem(schedule.mod) or vector_problem(schedule)
            or work_problem(schedule, original))  # fmt: skip


def work_problem(schedule: Any, original: IRModule | PrimFunc) -> str | None:
    """Why a replayed ``schedule`` runs iterations its blocks do not need, or ``None``.

    A served ``Split`` of a 128-long loop by factors 32768 x 32768 keeps its bounds check (and
    so its result) and loops 2**30 times: two of them made a kernel of 128 additions run for
    hours; each instruction is allowed, their product is not. So, for each block, the loops its
    bindings or its bounds check name (the loops that walk its iteration space) may together
    run at most :data:`MAX_PADDING` times the module's largest block and
    :data:`PADDING_ITERATIONS` more (not its own space: a GPU tile's copy of ``A`` is made once
    for each thread block, ``N / tile`` times ``A``, 37 times at ``N=37``, and more at larger
    ``N``); a loop that no block below it names (one that only repeats) may not be longer
    than 1.
    A loop that repeats a block it does not walk (a producer computed inside its consumer's
    loops recomputes, as MetaSchedule's own schedules do) is bounded by the block below it that
    walks it, and the kernel as a whole: all its blocks' iterations together at most
    :data:`MAX_PADDING` times the module's, times its longest loop (a recomputation repeats a
    block at most that often), and :data:`PADDING_ITERATIONS` more (each block bounded alone,
    a producer padded inside a padded loop of its consumer multiplied their paddings: 1.2e9
    iterations for 8,192 multiply-adds). Loops bound to GPU threads are not counted: they run
    side by side, as many as a block has threads (a CUDA reduction of 28 split over 512
    threads is MetaSchedule's own). ``original`` says the module's iterations and longest loop
    (a module of loops of no constant extent: nothing is bounded)."""
    before = _nests(original)
    if before is None:
        return None
    nests = _nests(schedule.mod)
    if nests is None:
        return "a loop of no constant extent where the module's loops are constant"
    largest = max((space for _, space, _ in before), default=1)
    named: set[Any] = set()
    for name, space, loops in nests:
        walked = math.prod(extent for var, extent, names in loops if names)
        named.update(var for var, _, names in loops if names)
        if walked > MAX_PADDING * max(space, largest) + PADDING_ITERATIONS:
            return (f"block {name} runs {walked:.3g} iterations, more than {MAX_PADDING} times "
                    f"the module's largest block ({largest:.3g}) and {PADDING_ITERATIONS} "
                    "more")  # fmt: skip
    for _, _, loops in nests:
        for var, extent, _ in loops:
            if extent > 1 and var not in named:
                return f"loop {var} ({extent} long) repeats blocks none of which walks it"
    module = sum(math.prod(e for _, e, _ in loops) for _, _, loops in before)
    longest = max((e for _, _, loops in before for _, e, _ in loops), default=1)
    runs = sum(math.prod(e for _, e, _ in loops) for _, _, loops in nests)
    if runs > MAX_PADDING * module * longest + PADDING_ITERATIONS:
        return (f"its blocks run {runs:.3g} iterations in all, more than {MAX_PADDING} times "
                f"the module's {module:.3g} times its longest loop ({longest}), and "
                f"{PADDING_ITERATIONS} more")  # fmt: skip
    return None


Nest = tuple[str, int, list[tuple[Any, int, bool]]]


def _nests(mod: IRModule | PrimFunc) -> list[Nest] | None:
    """Each block of ``mod``'s functions as ``(name, its iteration space, [(loop variable,
    extent, whether the block's bindings or bounds check name it) for each loop above it])``,
    loops bound to GPU threads left out (they run side by side); ``None`` when a loop or an
    iteration space is not of constant extent."""
    from tvm.s_tir.stmt import SBlockRealize
    from tvm.tirx import For
    from tvm.tirx.analysis import undefined_vars

    nests: list[Nest] = []
    stack: list[tuple[Any, int]] = []

    def walk(node: Any) -> bool:
        if isinstance(node, SBlockRealize):
            space = [getattr(v.dom.extent, "value", None) for v in node.block.iter_vars]
            if not all(isinstance(e, int) for e in space):
                return False
            seen = [v for e in [*node.iter_values, node.predicate] for v in undefined_vars(e)]
            loops = [(var, ext, any(var.same_as(v) for v in seen)) for var, ext in stack]
            nests.append((node.block.name_hint, math.prod(space), loops))  # type: ignore[arg-type]
            return all(walk(c) for c in (node.block.init, node.block.body) if c is not None)
        if isinstance(node, For):
            extent = getattr(node.extent, "value", None)
            if not isinstance(extent, int):
                return False
            tag = str(getattr(node.thread_binding, "thread_tag", ""))
            threads = tag.startswith("threadIdx") and extent <= MAX_THREADS  # side by side
            if not threads:
                stack.append((node.loop_var, extent))
            try:
                return walk(node.body)
            finally:
                if not threads:
                    stack.pop()
        children = [getattr(node, a, None) for a in ("body", "then_case", "else_case")]
        return all(walk(c) for c in [*getattr(node, "seq", ()), *children] if c is not None)

    functions = mod.functions.values() if hasattr(mod, "functions") else [mod]
    for function in functions:
        if hasattr(function, "body") and not walk(function.body):
            return None
    return nests


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
