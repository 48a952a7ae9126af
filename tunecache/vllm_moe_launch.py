"""What a fused-MoE config file's entry must be for the engine to launch it on a device: no field
its CUDA launch does not take, tiles within the shared memory the device gives a block, a
``tl.dot`` K that NVIDIA's Triton compiles, and no more accumulator values per thread than the
engine's own tuner tries; tuned entries, inside that tuner's space besides.

Every limit is the device's or the engine's, never what an entry or a record says of itself: an
imported file is a write token's word, and an entry that cannot launch (or spills its
accumulators for as long as it runs) would fail the engine while it serves, not in a benchmark.

Example:
    >>> from tunecache.vllm_moe import EngineDevice
    >>> entry = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 8, "GROUP_SIZE_M": 1,
    ...          "num_warps": 4, "num_stages": 3}
    >>> launch_problem(entry, EngineDevice.named("NVIDIA_H100"))
    'BLOCK_SIZE_K=8 is under the 16 a 16-bit tl.dot takes on NVIDIA GPUs'
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from tunecache.vllm_moe import FIELDS, EngineDevice, MoeShape

# The space vLLM's tuner searches on CUDA (benchmark_moe.get_configs_compute_bound: 1,920 configs),
# and the values the engine's untuned defaults take besides (BLOCK_SIZE_K 32 and GROUP_SIZE_M 8
# in its batch-invariant mode and older releases). Written by ``sync`` only inside these.
ENGINE_SPACE: Final[Mapping[str, tuple[int, ...]]] = {
    "BLOCK_SIZE_M": (16, 32, 64, 128, 256),
    "BLOCK_SIZE_N": (32, 64, 128, 256),
    "BLOCK_SIZE_K": (64, 128, 256),
    "GROUP_SIZE_M": (1, 16, 32, 64),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4, 5),
}
_DEFAULTS_BESIDES: Final[Mapping[str, tuple[int, ...]]] = {"BLOCK_SIZE_K": (32,),
                                                          "GROUP_SIZE_M": (8,)}  # fmt: skip

# The most float32 accumulator values a thread holds (a BLOCK_SIZE_M x BLOCK_SIZE_N tile over the
# block's 32 x num_warps threads) that the engine's tuner's space reaches: 256 x 256 on 4 warps,
# 512 (vLLM's shipped files hold at most 256). A thread has 255 registers: an imported 1024 x 1024
# tile on one warp would hold 32,768 each, spilled for as long as it ran, if it compiled at all.
MAX_ACCUMULATORS: Final = (max(ENGINE_SPACE["BLOCK_SIZE_M"]) * max(ENGINE_SPACE["BLOCK_SIZE_N"])
                           // (32 * min(ENGINE_SPACE["num_warps"])))  # fmt: skip


def shared_bytes(
    entry: Mapping[str, int], element_size: int = 2, shape: MoeShape | None = None
) -> int:
    """Shared memory an entry's kernel is estimated to need: ``num_stages`` buffered A and B
    tiles of ``element_size`` bytes (bfloat16 and float16: 2). With the ``shape`` of the file the
    entry is in, as the engine launches it: its dtype's sizes (``fp8_w8a8``: 1 byte each,
    ``int4_w4a16``: 2 and half a byte) and a block-quantised file's ``BLOCK_SIZE_K`` cut to its
    block (the engine does), so that its own shipped files are not held to bfloat16's sizes."""
    bm, bn, bk = int(entry["BLOCK_SIZE_M"]), int(entry["BLOCK_SIZE_N"]), launched_k(entry, shape)
    a_bits = b_bits = 8 * element_size
    if shape is not None:
        a_bits, b_bits = _dtype_bits(shape.dtype)
    return int(entry["num_stages"]) * -(-(bm * bk * a_bits + bk * bn * b_bits) // 8)


def launched_k(entry: Mapping[str, int], shape: MoeShape | None = None) -> int:
    """The ``BLOCK_SIZE_K`` the engine launches ``entry`` with in a file of ``shape``: cut to a
    block-quantised file's block (the least of its two sides, as the engine does)."""
    bk = int(entry["BLOCK_SIZE_K"])
    if shape is not None and shape.block_shape is not None:
        bk = min(bk, *shape.block_shape)
    return bk


def _dtype_bits(dtype: str | None) -> tuple[int, int]:
    """Bits of an activation and of a weight in a file of ``dtype`` (``fp8_w8a8`` → 8 and 8);
    16 each where the name does not say (the engine's unquantized files: bfloat16, float16)."""
    found = re.fullmatch(r"[a-z0-9]+_w(?P<w>[0-9]{1,2})a(?P<a>[0-9]{1,2})", dtype or "")
    if found is None:
        return 16, 16
    return min(int(found["a"]), 16) or 16, min(int(found["w"]), 16) or 16


def engine_entry_problem(entry: Mapping[str, int], device: EngineDevice) -> str | None:
    """Why a tuned entry is not one to hand the engine for ``device``, or ``None``: a value
    outside the engine's tuner's space (:data:`ENGINE_SPACE`), or what
    :func:`launch_problem` finds."""
    for field, choices in ENGINE_SPACE.items():
        if entry.get(field) not in (*choices, *_DEFAULTS_BESIDES.get(field, ())):
            return f"{field}={entry.get(field)!r} is outside the engine's tuner's space"
    return launch_problem(entry, device)


def launch_problem(
    entry: Mapping[str, int],
    device: EngineDevice,
    shape: MoeShape | None = None,
    *,
    least: bool = False,
) -> str | None:
    """Why the engine's launch of ``entry`` on ``device`` would fail, or ``None``: a field its
    CUDA launch does not take (ROCm's ``kpack``…: the engine passes the entry to the kernel as
    keywords, and Triton refuses one it does not know), or tiles whose shared memory is over
    what the device gives a block (:func:`shared_bytes`; ``shape``: the file's). The limits are
    the device's, never what a record says of itself. ``least``: count only the buffers a
    pipeline of ``num_stages`` must hold (one fewer: what every NVIDIA entry vLLM ships fits on
    its device), for entries measured on the device elsewhere (imported files), where the full
    count would drop entries that run. A device of another platform (AMD's, Intel's) or not
    known here has nothing to hold an entry to: ``None``."""
    if device.kind is None:
        return None
    foreign = sorted(set(entry) - set(FIELDS))
    if foreign:
        return f"field(s) {', '.join(map(repr, foreign))} are not the engine's CUDA launch's"
    if device.kind == "cuda" and (why := _cuda_problem(entry, shape)) is not None:
        return why
    stages = max(int(entry["num_stages"]) - 1, 1) if least else int(entry["num_stages"])
    needed = shared_bytes({**entry, "num_stages": stages}, shape=shape)
    if needed > device.shared:
        return f"its tiles need {needed} B of shared memory, over {device.what}'s {device.shared} B"
    return None


def _cuda_problem(entry: Mapping[str, int], shape: MoeShape | None) -> str | None:
    """What NVIDIA's Triton would refuse of ``entry`` in a file of ``shape``, or spill: a
    ``tl.dot`` K under what its operands take (Triton's ``min_dot_size``: 32 for 8-bit
    activations, 16 otherwise; a narrower weight is widened to the activations' type first),
    or more accumulator values per thread than :data:`MAX_ACCUMULATORS`. The interpreter takes
    any (its dot has no least size, and a CPU thread no register file)."""
    bits = _dtype_bits(shape.dtype if shape is not None else None)[0]
    least_k, k = (32 if bits <= 8 else 16), launched_k(entry, shape)
    if k < least_k:
        return f"BLOCK_SIZE_K={k} is under the {least_k} a {bits}-bit tl.dot takes on NVIDIA GPUs"
    tile, threads = entry["BLOCK_SIZE_M"] * entry["BLOCK_SIZE_N"], 32 * entry["num_warps"]
    if tile // threads > MAX_ACCUMULATORS:
        return (f"its {entry['BLOCK_SIZE_M']}x{entry['BLOCK_SIZE_N']} tile on {threads} threads "
                f"holds {tile // threads} accumulators a thread, over the {MAX_ACCUMULATORS} the "
                "engine's tuner goes to")  # fmt: skip
    return None
