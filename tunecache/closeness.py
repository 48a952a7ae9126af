"""How far an output is from the one it should equal: the relative and largest absolute error,
in float64, a chunk at a time on the tensors' own device.

On a GPU, copying two outputs to the host in float64 to compare them costs more than the kernel's
whole tuning step for a large GEMM; on the device it is a few launches. A chunk at a time, the
comparison holds a few chunk-sized float64 buffers beside the tensors, never a float64 copy of
them.
"""

from __future__ import annotations

import math
from typing import Any

CHUNK = 1 << 22  # elements compared at a time, in float64: 32 MiB a buffer


def relative_errors(got: Any, want: Any) -> tuple[float, float] | None:
    """``(‖got − want‖ / ‖want‖, max |got − want|)`` of two tensors of the same shape
    (``‖got − want‖`` where ``want`` is all zeros), computed on ``got``'s device (the host for a
    device without float64); None where a difference, a norm or the ratio is NaN or infinite:
    an error that cannot be measured is never a small one."""
    import torch

    if tuple(got.shape) != tuple(want.shape):
        raise ValueError(f"shapes differ: {tuple(got.shape)} and {tuple(want.shape)}")
    device = got.device if got.device.type != "mps" else torch.device("cpu")  # no float64 there
    flat_got, flat_want = got.reshape(-1), want.reshape(-1)
    zero = torch.zeros((), dtype=torch.float64, device=device)
    diff_norm, want_norm, largest = zero, zero, zero
    for start in range(0, flat_got.numel(), CHUNK):
        x = flat_got[start : start + CHUNK].to(device=device, dtype=torch.float64)
        y = flat_want[start : start + CHUNK].to(device=device, dtype=torch.float64)
        diff = x - y
        biggest = diff.abs().max()  # NaN if any difference is: it stays NaN through the sums
        diff_norm = torch.hypot(diff_norm, _norm(diff, biggest))
        want_norm = torch.hypot(want_norm, _norm(y, y.abs().max()))
        largest = torch.maximum(largest, biggest)
    norm, scale, worst = diff_norm.item(), want_norm.item(), largest.item()
    rel = norm / scale if scale > 0 else norm
    if not all(math.isfinite(v) for v in (norm, scale, worst, rel)):
        return None
    return rel, worst


def _norm(values: Any, biggest: Any) -> Any:
    """The 2-norm of float64 ``values`` whose largest magnitude is ``biggest``, scaled by it
    first: squaring values over 1e154 would overflow to inf."""
    import torch

    scale = biggest.clamp_min(torch.finfo(torch.float64).tiny)
    return scale * torch.linalg.vector_norm(values / scale)
