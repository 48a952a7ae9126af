"""Knob schedule for GEMM-shaped workloads (``matmul``, ``bias_gelu``): Σ_k A·B, then an epilogue.

The loop nest, for tiles ``(ti, tj, tk)``::

    for io, jo in tiles of (M, N):            # fused and parallel when `parallel`
        C_local[ti, tj] = 0                   # a per-tile accumulator ("local": registers/stack)
        for ko in K / tk:
            for ki in tk: for ii in ti: for ji in tj:   # ji vectorised when `vectorize`
                C_local[ii, ji] += A[i, k] * B[k, j]
        C[tile] = epilogue(C_local)           # bias + GELU inlined into the write-back

``unroll`` explicitly unrolls the innermost loops up to that many iterations. A problem that a
tile does not divide (an odd "edge" size) is padded first (``pad_einsum``): A and B are copied into
zero-padded buffers, the tile loops run without predicates (so they stay vectorised), and only the
write-back checks bounds. One config therefore schedules every problem size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from backends.tvm.knobs.common import (
    annotate_unroll,
    is_reduction,
    knob_summary,
    loop_extent,
    root_blocks,
)
from tunecache.space import Config, Scalar

if TYPE_CHECKING:
    from tvm.s_tir import Schedule
    from tvm.s_tir.schedule import SBlockRV
    from tvm.tirx import PrimFunc

NAME = "gemm"
TILES_IJ: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
TILES_J: tuple[int, ...] = (4, 8, 16, 32, 64)  # the vector axis: 1- and 2-wide tiles are scalar
TILES_K: tuple[int, ...] = (1, 4, 8, 16, 32)
UNROLLS: tuple[int, ...] = (0, 16, 64)
MAX_ACCUMULATOR = 256  # values in a ti × tj accumulator tile (16 AVX-512 / 32 AVX2 registers)

PARAMS: dict[str, tuple[Scalar, ...]] = {
    "tile_i": TILES_IJ,
    "tile_j": TILES_J,
    "tile_k": TILES_K,
    "vectorize": (False, True),
    "parallel": (False, True),
    "unroll": UNROLLS,
}
DEFAULT: dict[str, Scalar] = {
    "tile_i": 8,
    "tile_j": 32,
    "tile_k": 16,
    "vectorize": True,
    "parallel": True,
    "unroll": 16,
}


def prune_reason(problem: Mapping[str, int], config: Config) -> str | None:
    """Why ``config`` is left out of the space at ``problem`` (redundant or spilling), or None.

    A tile larger than its dimension schedules correctly (padded) but repeats a smaller tile's
    work, so it is pruned; so is an accumulator tile too large to stay in registers.
    """
    for knob, dim in (("tile_i", "M"), ("tile_j", "N"), ("tile_k", "K")):
        if int(config[knob]) > problem[dim]:
            return f"{knob}={config[knob]} exceeds {dim}={problem[dim]}"
    ti, tj = int(config["tile_i"]), int(config["tile_j"])
    if ti * tj > MAX_ACCUMULATOR:
        return f"accumulator tile {ti}x{tj} holds more than {MAX_ACCUMULATOR} values"
    return None


def summarize(config: Mapping[str, Any]) -> str:
    """``knobs i8 j32 k16 vec par u16``."""
    return knob_summary(
        f"knobs i{config['tile_i']} j{config['tile_j']} k{config['tile_k']}", config
    )


def schedule(func: PrimFunc, config: Mapping[str, Any]) -> Schedule:
    """``func`` (one reduction block over (i, j, k), then element-wise epilogues) scheduled.

    Raises:
        ValueError: ``func`` is not GEMM-shaped.
        tvm.s_tir.ScheduleError: a primitive failed (reported by the caller).
    """
    from tvm.s_tir import Schedule

    ti, tj, tk = int(config["tile_i"]), int(config["tile_j"]), int(config["tile_k"])
    vectorize, parallel = bool(config["vectorize"]), bool(config["parallel"])
    sch = Schedule(func)
    reductions = [b for b in root_blocks(sch) if is_reduction(sch, b)]
    if len(reductions) != 1 or len(sch.get_loops(reductions[0])) != 3:
        raise ValueError("the GEMM knob schedule needs exactly one (i, j, k) reduction block")
    gemm = reductions[0]
    extents = [loop_extent(sch, loop) for loop in sch.get_loops(gemm)]
    padded = any(extent % tile for extent, tile in zip(extents, (ti, tj, tk), strict=True))
    if padded:
        sch.pad_einsum(gemm, [ti, tj, tk])
    producers = _before(sch, gemm)  # A_pad, B_pad when padded

    i, j, k = sch.get_loops(gemm)
    io, ii = sch.split(i, [None, ti])
    jo, ji = sch.split(j, [None, tj])
    ko, ki = sch.split(k, [None, tk])
    sch.reorder(io, jo, ko, ki, ii, ji)
    write = sch.cache_write(gemm, 0, "local")
    sch.reverse_compute_at(write, jo)
    epilogue = _after(sch, write)
    if padded:
        # The copy out of the padded buffer (bounds-checked) goes under the tile; the element-wise
        # epilogue is inlined into it.
        unpad, epilogue = epilogue[0], epilogue[1:]
        sch.reverse_compute_at(unpad, jo)
        tail = [write, unpad]
    else:
        tail = [write]
    for block in epilogue:
        sch.reverse_compute_inline(block)

    outer = sch.fuse(io, jo) if parallel else io
    if parallel:
        sch.parallel(outer)
        for producer in producers:
            sch.parallel(sch.get_loops(producer)[0])
    annotate_unroll(sch, outer, int(config["unroll"]))
    if vectorize:
        for block in (gemm, *tail):
            sch.vectorize(sch.get_loops(block)[-1])
    init = sch.decompose_reduction(gemm, ko)
    if vectorize:
        sch.vectorize(sch.get_loops(init)[-1])
    return sch


def _before(sch: Schedule, block: SBlockRV) -> list[SBlockRV]:
    """The blocks that run before ``block`` in program order (the padding copies)."""
    blocks, name = root_blocks(sch), sch.get(block).name_hint
    return blocks[: [sch.get(b).name_hint for b in blocks].index(name)]


def _after(sch: Schedule, block: SBlockRV) -> list[SBlockRV]:
    """The blocks that run after ``block`` in program order (its epilogues)."""
    blocks, name = root_blocks(sch), sch.get(block).name_hint
    return blocks[[sch.get(b).name_hint for b in blocks].index(name) + 1 :]
