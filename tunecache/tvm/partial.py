"""Whether a replayed schedule makes a block read a reduction before it is finished.

TVM checks each ``ComputeAt`` and ``ReverseComputeAt`` as it replays it, but not where the block
lands: moved under a loop of its producer's *reduction* (``D[i] = sum_j C[i, j]`` placed under
the ``k`` of ``C = A @ B``), the consumer runs once per step of that loop and reads the partial
sums written so far. TVM accepted such a served trace, and the kernel built from it summed
partial values (max abs error 574 against numpy), with no error anywhere. So a schedule in which
a block sits inside a loop that walks another block's reduction, and reads what that block
writes (or writes it too: an init under the reduction resets it), is refused
(:func:`partial_problem`), whatever instructions put it there.

This is stricter than a result check needs: a consumer that recomputes all its output on each
step of the producer's reduction keeps the right result, only wasting the steps before the last.
MetaSchedule's own schedules never put a block there (they compute a consumer at the tiles above
a reduction's loops, and producers, which read nothing a reduction writes, inside them), so
refusing all of them costs no honest record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Placed:
    """One block as the replayed module holds it."""

    name: str
    loops: list[tuple[Any, Any]]  # (loop variable, extent) of each loop above it, outermost first
    reduction: list[Any] = field(default_factory=list)  # loop variables its reduction walks
    reads: list[Any] = field(default_factory=list)  # buffers (their ``TensorRegion.source``)
    writes: list[Any] = field(default_factory=list)
    outer: list[str] = field(default_factory=list)  # the blocks it is nested in (blockized)


def partial_problem(mod: Any) -> str | None:
    """Why ``mod`` (a replayed schedule's module, or a function) has a block that reads or
    writes what another block's reduction writes, from inside a loop of that reduction, or
    ``None``.

    A loop walks a block's reduction when its variable appears in the binding of one of the
    block's iteration variables that is not data-parallel; loops of extent 1 take one step and
    are left out.
    """
    functions = mod.functions.values() if hasattr(mod, "functions") else [mod]
    for function in functions:
        if not hasattr(function, "body"):
            continue
        blocks = _placed(function.body)
        for producer in blocks:
            for consumer in blocks:
                if consumer is not producer and (why := _inside(producer, consumer)):
                    return why
    return None


def _inside(producer: _Placed, consumer: _Placed) -> str | None:
    """Why ``consumer`` sits inside a loop of ``producer``'s reduction and touches what it
    writes, or ``None``."""
    if producer.name in consumer.outer:  # its own init or body, a blockized reduction's
        return None
    loop = next((var for var, _ in consumer.loops
                 if any(var.same_as(r) for r in producer.reduction)), None)  # fmt: skip
    if loop is None:
        return None
    for buffer in producer.writes:
        read = any(_same(buffer, b) for b in consumer.reads)
        if read or any(_same(buffer, b) for b in consumer.writes):
            what = "reads" if read else "writes"
            return (f"block {consumer.name} {what} {buffer.name} inside loop {loop.name} of "
                    f"block {producer.name}'s reduction, before that reduction has finished "
                    "writing it (a partial result)")  # fmt: skip
    return None


def _placed(body: Any) -> list[_Placed]:
    """Each block below ``body``, with the loops above it and what it reads and writes."""
    from tvm.s_tir.stmt import SBlockRealize
    from tvm.tirx import For, IterVar
    from tvm.tirx.analysis import undefined_vars

    blocks: list[_Placed] = []
    stack: list[tuple[Any, Any]] = []
    outer: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, SBlockRealize):
            block = node.block
            placed = _Placed(block.name_hint, list(stack),
                             reads=[r.source for r in block.reads],
                             writes=[w.source for w in block.writes],
                             outer=list(outer))  # fmt: skip
            for var, value in zip(block.iter_vars, node.iter_values, strict=True):
                if var.iter_type != IterVar.DataPar:
                    placed.reduction.extend(undefined_vars(value))
            placed.reduction = [v for v in placed.reduction if _steps(stack, v)]
            blocks.append(placed)
            outer.append(block.name_hint)
            try:
                for child in (block.init, block.body):
                    if child is not None:
                        walk(child)
            finally:
                outer.pop()
            return
        if isinstance(node, For):
            stack.append((node.loop_var, node.extent))
            try:
                walk(node.body)
            finally:
                stack.pop()
            return
        children = [getattr(node, a, None) for a in ("body", "then_case", "else_case")]
        for child in [*getattr(node, "seq", ()), *children]:
            if child is not None:
                walk(child)

    walk(body)
    return blocks


def _same(one: Any, other: Any) -> bool:
    """Whether two buffers of a block's reads or writes are one (or views of one's data)."""
    if one.same_as(other):
        return True
    data = getattr(one, "data", None)
    return data is not None and data.same_as(getattr(other, "data", None))


def _steps(stack: list[tuple[Any, Any]], var: Any) -> bool:
    """Whether ``var`` is a loop of ``stack`` that may take more than one step."""
    extent = next((e for v, e in stack if v.same_as(var)), None)
    return extent is not None and getattr(extent, "value", None) != 1
