"""Knob schedule for row-wise workloads (``softmax``, ``layernorm``, ``rmsnorm``) over X[M, N].

Every stage of one row (its reductions: max, sum, mean, variance; its element-wise parts) is
computed under the row loop, so a row stays in cache from the first pass to the output::

    for io in M / rows:                       # parallel when `parallel`: `rows` rows per chunk
        for ii in rows:
            red_lanes[vector] = Σ over N/vector of X[i, ko*vector + lane]  # lanes vectorised
            red = Σ red_lanes                                             # (rfactor)
            for jo in N / vector: for lane in vector: Y[i, j] = ...       # vectorised

``vector`` = 1 leaves every loop scalar. Where ``vector`` does not divide N (an odd "edge"
problem) the element-wise stages split with a predicate, which TVM keeps correct, and the split
loops carry a loop-partition hint so only the last, partial vector is guarded and the rest stays
vectorised; the reductions then stay scalar (see :func:`schedule`). ``rows`` that do not divide M
are predicated the same way. One config therefore schedules every problem size correctly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from backends.tvm.knobs.common import (
    PARTITION_HINT,
    annotate_unroll,
    is_reduction,
    knob_summary,
    loop_extent,
    reduction_and_spatial,
    root_blocks,
)
from tunecache.space import Config, Scalar

if TYPE_CHECKING:
    from tvm.s_tir import Schedule
    from tvm.tirx import PrimFunc

NAME = "rows"
ROWS: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
VECTORS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
UNROLLS: tuple[int, ...] = (0, 16, 64)

PARAMS: dict[str, tuple[Scalar, ...]] = {
    "rows": ROWS,
    "vector": VECTORS,
    "parallel": (False, True),
    "unroll": UNROLLS,
}
DEFAULT: dict[str, Scalar] = {"rows": 4, "vector": 16, "parallel": True, "unroll": 16}


def prune_reason(problem: Mapping[str, int], config: Config) -> str | None:
    """Why ``config`` is left out of the space at ``problem`` (it repeats another), or None."""
    if int(config["rows"]) > problem["M"]:
        return f"rows={config['rows']} exceeds M={problem['M']}"
    if int(config["vector"]) > problem["N"]:
        return f"vector={config['vector']} exceeds N={problem['N']}"
    if not config["parallel"] and config["rows"] != 1:
        return "rows only sizes the parallel chunks: without parallel it is the rows=1 schedule"
    return None


def summarize(config: Mapping[str, Any]) -> str:
    """``knobs r4 v16 par u16``."""
    return knob_summary(f"knobs r{config['rows']} v{config['vector']}", config)


def schedule(func: PrimFunc, config: Mapping[str, Any]) -> Schedule:
    """``func`` (row reductions and element-wise stages, the output last) scheduled.

    Raises:
        ValueError: ``func`` is not row-wise over a 2-D output.
        tvm.s_tir.ScheduleError: a primitive failed (reported by the caller).
    """
    from tvm.s_tir import Schedule

    rows, vector = int(config["rows"]), int(config["vector"])
    sch = Schedule(func)
    blocks = root_blocks(sch)
    output = blocks[-1]
    if is_reduction(sch, output) or len(sch.get_loops(output)) != 2:
        raise ValueError("the row knob schedule needs an element-wise (i, j) output block")
    # Element-wise stages read once (softmax's x − max) are recomputed where they are read.
    for block in blocks[:-1]:
        if not is_reduction(sch, block) and len(sch.get_consumers(block)) == 1:
            sch.compute_inline(block)
    # Row reductions: `vector` partial results, one per lane, then a reduction over the lanes.
    # rfactor needs the block at the root, so it comes before compute_at; but compute_at drops
    # the block's own split predicate (TVM 0.27), so a width that does not divide the row would
    # read past it: then the reductions stay scalar (the element-wise stages still vectorise).
    lanes: set[str] = set()
    for block in root_blocks(sch)[:-1]:
        if is_reduction(sch, block):
            loops = sch.get_loops(block)
            if len(loops) != 2:
                raise ValueError("the row knob schedule needs (i, k) row reductions")
            if vector > 1 and loop_extent(sch, loops[1]) % vector == 0:
                _, lane = sch.split(loops[1], [None, vector])
                lanes.add(sch.get(sch.rfactor(lane, 1)).name_hint)

    i, _ = sch.get_loops(output)
    io, ii = sch.split(i, [None, rows])
    if config["parallel"]:
        sch.parallel(io)
    annotate_unroll(sch, io, int(config["unroll"]))
    for block in reversed(root_blocks(sch)[:-1]):
        sch.compute_at(block, ii)
    if vector == 1:
        return sch
    for block in sch.get_child_blocks(ii):
        if sch.get(block).name_hint in lanes:
            reduce, spatial = reduction_and_spatial(sch, block, sch.get_loops(block)[-2:])
            sch.reorder(reduce[0], spatial[0])  # lanes innermost (the row divides: no predicate)
            sch.vectorize(spatial[0])
            init = sch.decompose_reduction(block, reduce[0])
            sch.vectorize(sch.get_loops(init)[-1])
        elif not is_reduction(sch, block):
            outer, lane = sch.split(sch.get_loops(block)[-1], [None, vector])
            sch.annotate(outer, PARTITION_HINT, 1)
            sch.vectorize(lane)
        # else: the reduction over the lanes (short, scalar)
    return sch
