"""The two shapes of Triton config space: tiled GEMMs and row-wise reductions.

Each workload's ``triton.py`` builds its space here, so every kernel family prunes by the same
rules before anything is compiled. Prune reasons are sentences a person can act on.

GEMM (``matmul``, ``bias_gelu``): ``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K``, ``GROUP_M``,
``SPLIT_K`` (K-slices computed by separate programs and summed after; 1 when a config, such as
a record tuned before it existed, does not name it), ``num_warps``, ``num_stages``.

Row kernels (``softmax``, ``layernorm``, ``rmsnorm``): ``BLOCK_N``
(columns per tile; a tile that covers the row keeps it in registers, a smaller one loops over
it), ``ROWS_PER_PROGRAM``, ``num_warps``, ``num_stages`` (pipelining of the loop).

Example:
    >>> from workloads.triton_kit.limits import DeviceLimits
    >>> space = gemm_space({"M": 4096, "N": 4096, "K": 4096}, "float16", DeviceLimits.H100)
    >>> gemm_default({"M": 4096, "N": 4096, "K": 4096}, "float16", DeviceLimits.H100)["BLOCK_N"]
    256
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Protocol

from tunecache.builtin import TRITON_GEMM, TRITON_GEMM_DEFAULTS, TRITON_ROWS
from tunecache.errors import InvalidInput
from tunecache.space import Config, SearchSpace
from workloads.triton_kit.limits import DeviceLimits, current_limits

logger = logging.getLogger(__name__)

DOT_MIN = 16  # tl.dot needs every dimension of its operands to be at least 16
# The enumerated choices (TRITON_GEMM, TRITON_ROWS) live with the built-in kernels' specs: a
# served config is checked against them by the client and the server, which import no backend.
SPLIT_K_MAX_WAVES = 2  # split K only while the output tiles fill the SMs fewer times than this
SPLIT_K_MAX_SPLIT_WAVES = 4  # ... and into no more programs than fill them this many times
SPLIT_K_MAX_WORKSPACE = 64 * 2**20  # bytes of fp32 partial sums
# Register heuristics (fp32 values live per thread): past these, kernels spill to local memory.
MAX_ACCUMULATORS_PER_THREAD = 256
MMA_TILE = 16 * 16  # the output elements of one warp's smallest useful share of a GEMM tile
MAX_ROW_VALUES_PER_THREAD = 128
MAX_TENSOR_NUMEL = 1 << 20  # Triton's TRITON_MAX_TENSOR_NUMEL

# The fp16 configs of Triton's matmul tutorial (03-matrix-multiplication.py), in its order:
# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_stages, num_warps).
TUTORIAL_GEMM_CONFIGS: tuple[tuple[int, int, int, int, int, int], ...] = (
    (128, 256, 64, 8, 3, 8),
    (64, 256, 32, 8, 4, 4),
    (128, 128, 32, 8, 4, 4),
    (128, 64, 32, 8, 4, 4),
    (64, 128, 32, 8, 4, 4),
    (128, 32, 32, 8, 4, 4),
    (64, 32, 32, 8, 5, 2),
    (32, 64, 32, 8, 5, 2),
)

_ELEMENT_SIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def element_size(dtype: str) -> int:
    """Bytes per element of ``dtype`` (one of the Triton backend's dtypes)."""
    try:
        return _ELEMENT_SIZE[dtype]
    except KeyError:
        raise InvalidInput(
            f"triton kernels take {', '.join(_ELEMENT_SIZE)}, not {dtype!r}"
        ) from None


def next_pow2(n: int) -> int:
    """The smallest power of two ≥ ``n`` (1 for ``n`` ≤ 1)."""
    return 1 << max(n - 1, 0).bit_length()


def _int(config: Config, name: str) -> int:
    return int(config[name])


class PruneReason(Protocol):
    """Why ``config`` cannot or should not run at ``problem`` on ``limits``, or ``None``."""

    def __call__(
        self, config: Config, problem: Mapping[str, int], dtype: str, limits: DeviceLimits
    ) -> str | None: ...


def pruned_space(
    choices: Mapping[str, tuple[int, ...]],
    prune_reason: PruneReason,
    problem: Mapping[str, int],
    dtype: str,
    limits: DeviceLimits,
    defaults: Mapping[str, int] | None = None,
) -> SearchSpace:
    """The space of ``choices`` without the configs ``prune_reason`` gives a reason against at
    ``problem`` in ``dtype`` on ``limits``; a config lacking a parameter of ``defaults`` means
    its default.

    Raises:
        InvalidInput: ``dtype`` is not one Triton kernels take.
    """
    element_size(dtype)
    constraint = functools.partial(prune_reason, problem=dict(problem), dtype=dtype, limits=limits)
    return SearchSpace(choices, constraint=constraint, defaults=dict(defaults or {}))


# -- GEMMs ----------------------------------------------------------------------------------


def gemm_shared_memory(config: Config, dtype: str) -> int:
    """Estimated shared memory: ``num_stages`` buffered A and B tiles."""
    bm, bn, bk = _int(config, "BLOCK_M"), _int(config, "BLOCK_N"), _int(config, "BLOCK_K")
    return _int(config, "num_stages") * (bm * bk + bk * bn) * element_size(dtype)


def gemm_prune_reason(
    config: Config, problem: Mapping[str, int], dtype: str, limits: DeviceLimits
) -> str | None:
    """Why a GEMM config cannot or should not run at ``problem`` on ``limits``, or ``None``."""
    blocks = {d: _int(config, f"BLOCK_{d}") for d in ("M", "N", "K")}
    if min(blocks.values()) < DOT_MIN:
        return f"tl.dot needs blocks of at least {DOT_MIN} in every dimension, got {blocks}"
    warps = _int(config, "num_warps")
    threads = warps * limits.warp_size
    if threads > limits.max_threads_per_block:
        return f"{threads} threads per block exceed {limits.name}'s {limits.max_threads_per_block}"
    smem = gemm_shared_memory(config, dtype)
    if smem > limits.max_shared_memory_per_block:
        return (
            f"{config['num_stages']} stages of {blocks['M']}x{blocks['K']} + "
            f"{blocks['K']}x{blocks['N']} {dtype} tiles need {smem} B of shared memory, "
            f"over {limits.name}'s {limits.max_shared_memory_per_block} B"
        )
    for dim, block in blocks.items():
        cap = max(DOT_MIN, 2 * next_pow2(problem[dim]))
        if block > cap:
            return f"BLOCK_{dim}={block} is far larger than {dim}={problem[dim]} (at most {cap})"
    fewest = min(TRITON_GEMM["num_warps"])
    if warps > fewest and blocks["M"] * blocks["N"] < warps * MMA_TILE:
        return (
            f"{warps} warps share a {blocks['M']}x{blocks['N']} tile: each gets less than one "
            f"16x16 MMA tile"
        )
    per_thread = blocks["M"] * blocks["N"] // threads
    if per_thread > MAX_ACCUMULATORS_PER_THREAD:
        return (
            f"a {blocks['M']}x{blocks['N']} fp32 accumulator over {threads} threads is "
            f"{per_thread} registers per thread (> {MAX_ACCUMULATORS_PER_THREAD}): it would spill"
        )
    return split_k_prune_reason(int(config.get("SPLIT_K", 1)), blocks, problem, limits)


def split_k_prune_reason(
    split: int, blocks: Mapping[str, int], problem: Mapping[str, int], limits: DeviceLimits
) -> str | None:
    """Why splitting K ``split`` ways cannot help at ``problem`` with these tiles, or ``None``.

    Split-K pays for a second launch and a workspace of fp32 partial sums; it helps only where
    the output tiles leave SMs idle (decode-shaped GEMMs: small M, long K).
    """
    if split == 1:
        return None
    m, n, k = problem["M"], problem["N"], problem["K"]
    piece = -(-k // split)
    if piece < blocks["K"]:
        return (
            f"SPLIT_K={split} cuts K={k} into slices of {piece}, shorter than BLOCK_K={blocks['K']}"
        )
    tiles = -(-m // blocks["M"]) * -(-n // blocks["N"])
    if tiles >= SPLIT_K_MAX_WAVES * limits.sm_count:
        return (
            f"{tiles} output tiles of {blocks['M']}x{blocks['N']} already fill {limits.name}'s "
            f"{limits.sm_count} SMs {tiles / limits.sm_count:.1f} times over: splitting K only "
            "adds work"
        )
    if tiles * split > SPLIT_K_MAX_SPLIT_WAVES * limits.sm_count:
        return (
            f"SPLIT_K={split} makes {tiles * split} programs of {tiles} tiles, over "
            f"{SPLIT_K_MAX_SPLIT_WAVES} waves of {limits.name}'s {limits.sm_count} SMs: a smaller "
            "split fills them"
        )
    workspace = split * m * n * 4
    if workspace > SPLIT_K_MAX_WORKSPACE:
        return (
            f"SPLIT_K={split} needs {workspace / 2**20:.0f} MiB of fp32 partial sums for a "
            f"{m}x{n} output (at most {SPLIT_K_MAX_WORKSPACE // 2**20} MiB)"
        )
    return None


def gemm_space(problem: Mapping[str, int], dtype: str, limits: DeviceLimits) -> SearchSpace:
    """The tiled-GEMM space for ``problem`` (``M``, ``N``, ``K``), pruned for ``limits``."""
    return pruned_space(
        TRITON_GEMM, gemm_prune_reason, problem, dtype, limits, TRITON_GEMM_DEFAULTS
    )


def gemm_default(
    problem: Mapping[str, int], dtype: str, limits: DeviceLimits | None = None
) -> Config:
    """The first of the matmul tutorial's configs inside the space; for small problems, the first
    that is once its blocks are shrunk to the problem; else the space's first config.

    ``limits`` defaults to this device's (:func:`~workloads.triton_kit.limits.current_limits`).
    """
    limits = limits or current_limits()
    space = gemm_space(problem, dtype, limits)
    candidates = [_tutorial_config(t) for t in TUTORIAL_GEMM_CONFIGS]
    shrunk = [
        c.replace(
            **{f"BLOCK_{d}": min(_int(c, f"BLOCK_{d}"), _block_for(problem[d])) for d in "MNK"}
        )
        for c in candidates
    ]
    for config in (*candidates, *shrunk):
        if space.contains(config):
            return config
    fallback = next(space.configs(), None)
    if fallback is None:
        raise InvalidInput(f"no triton GEMM config fits {problem} {dtype} on {limits.name}")
    logger.debug("no tutorial GEMM config fits %s %s; using %s", problem, dtype, fallback)
    return fallback


def _block_for(dim: int) -> int:
    return max(DOT_MIN, next_pow2(dim))


def _tutorial_config(t: tuple[int, int, int, int, int, int]) -> Config:
    bm, bn, bk, group, stages, warps = t
    return Config.of(
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group, "SPLIT_K": 1,
         "num_stages": stages, "num_warps": warps}
    )  # fmt: skip


# -- row kernels ----------------------------------------------------------------------------


def row_prune_reason(
    config: Config, problem: Mapping[str, int], dtype: str, limits: DeviceLimits
) -> str | None:
    """Why a row-kernel config cannot or should not run at ``problem`` on ``limits``, or None."""
    block, rows = _int(config, "BLOCK_N"), _int(config, "ROWS_PER_PROGRAM")
    warps, stages = _int(config, "num_warps"), _int(config, "num_stages")
    m, n = problem["M"], problem["N"]
    threads = warps * limits.warp_size
    if threads > limits.max_threads_per_block:
        return f"{threads} threads per block exceed {limits.name}'s {limits.max_threads_per_block}"
    if block > max(16, next_pow2(n)):
        return f"BLOCK_N={block} is larger than the row needs (N={n}: {next_pow2(n)} covers it)"
    if rows > next_pow2(m):
        return f"ROWS_PER_PROGRAM={rows} is more than the {m} rows there are"
    tile = rows * block
    if tile > MAX_TENSOR_NUMEL:
        return f"a {rows}x{block} tile has more than Triton's {MAX_TENSOR_NUMEL} elements"
    if tile // threads > MAX_ROW_VALUES_PER_THREAD:
        return (
            f"a {rows}x{block} fp32 tile over {threads} threads is {tile // threads} values per "
            f"thread (> {MAX_ROW_VALUES_PER_THREAD}): it would spill"
        )
    if warps > 1 and tile < threads:
        return f"{warps} warps for a {rows}x{block} tile: some warps would have no elements"
    if block >= n and stages > 1:
        return f"BLOCK_N={block} covers the row (N={n}): no loop to pipeline, num_stages must be 1"
    smem = stages * tile * element_size(dtype)
    if block < n and smem > limits.max_shared_memory_per_block:
        return (
            f"{stages} pipelined {rows}x{block} {dtype} tiles need {smem} B of shared memory, "
            f"over {limits.name}'s {limits.max_shared_memory_per_block} B"
        )
    return None


def row_space(problem: Mapping[str, int], dtype: str, limits: DeviceLimits) -> SearchSpace:
    """The row-kernel space for ``problem`` (``M`` rows of ``N``), pruned for ``limits``."""
    return pruned_space(TRITON_ROWS, row_prune_reason, problem, dtype, limits)


def row_default(
    problem: Mapping[str, int], dtype: str, limits: DeviceLimits | None = None
) -> Config:
    """Triton's layer-norm tutorial heuristic: one row per program, a block covering the row up
    to 64 KiB, ``num_warps = min(max(BLOCK_N // 256, 1), 8)``; the nearest config in the space
    (same block, fewest warps changed) when that one is pruned.

    ``limits`` defaults to this device's (:func:`~workloads.triton_kit.limits.current_limits`).
    """
    limits = limits or current_limits()
    space = row_space(problem, dtype, limits)
    block = min(max(16, next_pow2(problem["N"])), 65536 // element_size(dtype))
    warps = min(max(block // 256, 1), 8)
    stages = 1 if block >= problem["N"] else 2
    preferred = Config.of(
        {"BLOCK_N": block, "ROWS_PER_PROGRAM": 1, "num_warps": warps, "num_stages": stages}
    )
    if space.contains(preferred):
        return preferred
    ranked = sorted(
        space.configs(),
        key=lambda c: (
            abs(_int(c, "BLOCK_N").bit_length() - block.bit_length()),
            _int(c, "ROWS_PER_PROGRAM"),
            abs(_int(c, "num_warps").bit_length() - warps.bit_length()),
            _int(c, "num_stages") != stages,
        ),
    )
    if not ranked:
        raise InvalidInput(f"no triton row config fits {problem} {dtype} on {limits.name}")
    logger.debug("row default %s is pruned (%s); using %s", preferred,
                 space.prune_reason(preferred), ranked[0])  # fmt: skip
    return ranked[0]
