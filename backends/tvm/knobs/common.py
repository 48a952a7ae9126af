"""TIR schedule helpers shared by the knob families (imports TVM: call only from a schedule)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tvm.s_tir import Schedule
    from tvm.s_tir.schedule import LoopRV, SBlockRV

_COMM_REDUCE = 2  # tvm.tirx.IterVar.CommReduce
# MetaSchedule's unroll: a loop annotation that UnrollLoop reads when lowering.
UNROLL_MAX_STEP = "pragma_auto_unroll_max_step"
UNROLL_EXPLICIT = "pragma_unroll_explicit"
# LoopPartition peels the iterations of an annotated loop where a split predicate is false, so the
# main body of a loop split by a non-dividing factor has no predicate and stays vectorised.
PARTITION_HINT = "pragma_loop_partition_hint"


def root_blocks(sch: Schedule) -> list[SBlockRV]:
    """The blocks directly under the function's root block, in program order."""
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def is_reduction(sch: Schedule, block: SBlockRV) -> bool:
    """Whether ``block`` has a reduction block iterator."""
    return any(int(iv.iter_type) == _COMM_REDUCE for iv in sch.get(block).iter_vars)


def reduction_and_spatial(
    sch: Schedule, block: SBlockRV, loops: list[LoopRV]
) -> tuple[list[LoopRV], list[LoopRV]]:
    """``loops`` split into those bound to a reduction iterator of ``block`` and the others."""
    import tvm

    realize = tvm.get_global_func("s_tir.schedule.GetSBlockRealize")(sch, block)
    reduce_vars: set[str] = set()
    for iv, value in zip(realize.block.iter_vars, realize.iter_values, strict=True):
        if int(iv.iter_type) == _COMM_REDUCE:
            reduce_vars.update(str(v.name) for v in tvm.tirx.analysis.undefined_vars(value))
    reduce = [loop for loop in loops if str(sch.get(loop).loop_var.name) in reduce_vars]
    spatial = [loop for loop in loops if str(sch.get(loop).loop_var.name) not in reduce_vars]
    return reduce, spatial


def annotate_unroll(sch: Schedule, loop: LoopRV, max_step: int) -> None:
    """Explicitly unrolls the innermost loops under ``loop`` up to ``max_step`` iterations."""
    if max_step > 0:
        sch.annotate(loop, UNROLL_MAX_STEP, max_step)
        sch.annotate(loop, UNROLL_EXPLICIT, 1)


def loop_extent(sch: Schedule, loop: LoopRV) -> int:
    """The constant extent of ``loop``."""
    return int(sch.get(loop).extent)


def knob_summary(head: str, config: Mapping[str, Any]) -> str:
    """``head``, then ``vec``, ``par`` and ``u<unroll>`` for the flags the config sets."""
    parts = [head]
    if config.get("vectorize"):
        parts.append("vec")
    if config.get("parallel"):
        parts.append("par")
    if config.get("unroll"):
        parts.append(f"u{config['unroll']}")
    return " ".join(parts)
