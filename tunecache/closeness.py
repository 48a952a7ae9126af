"""How far an output is from the one it should equal: the relative and largest absolute error,
in float64, a chunk at a time on the tensors' own device.

On a GPU, copying two outputs to the host in float64 to compare them costs more than the kernel's
whole tuning step for a large GEMM; on the device it is a few launches. A chunk at a time, the
comparison never holds more than a chunk of float64 beside the tensors.
"""

from __future__ import annotations

from typing import Any

CHUNK = 1 << 22  # elements compared at a time, in float64: 32 MiB a buffer


def relative_errors(got: Any, want: Any) -> tuple[float, float] | None:
    """``(‖got − want‖ / ‖want‖, max |got − want|)`` of two tensors of the same number of
    elements (``‖got − want‖`` where ``want`` is all zeros); None where a difference is NaN or
    infinite. Computed on ``got``'s device (the host for a device without float64)."""
    import torch

    device = got.device if got.device.type != "mps" else torch.device("cpu")  # no float64 there
    flat_got, flat_want = got.reshape(-1), want.reshape(-1)
    zero = torch.zeros((), dtype=torch.float64, device=device)
    diff_norm, want_norm, largest = zero, zero, zero
    finite = torch.ones((), dtype=torch.bool, device=device)
    for start in range(0, flat_got.numel(), CHUNK):
        x = flat_got[start : start + CHUNK].to(device=device, dtype=torch.float64)
        y = flat_want[start : start + CHUNK].to(device=device, dtype=torch.float64)
        diff = x - y
        finite = finite & torch.isfinite(diff).all()
        diff_norm = torch.hypot(diff_norm, _norm(diff))
        want_norm = torch.hypot(want_norm, _norm(y))
        largest = torch.maximum(largest, diff.abs().max())
    if not bool(finite):
        return None
    norm, scale = diff_norm.item(), want_norm.item()
    return (norm / scale if scale > 0 else norm), largest.item()


def _norm(values: Any) -> Any:
    """The 2-norm of float64 ``values``, scaled by their largest magnitude first: squaring
    values over 1e154 would overflow to inf (and inf / inf is no error at all)."""
    import torch

    scale = values.abs().max().clamp_min(torch.finfo(torch.float64).tiny)
    return scale * torch.linalg.vector_norm(values / scale)
