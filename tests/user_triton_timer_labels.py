"""A user's Triton kernel tuned with their own ``do_bench`` that answers one number (a median),
as interpreter users are told to pass one; imported by ``tests/test_triton_timer_labels.py``'s
processes (``TRITON_INTERPRET=1`` set by the test)."""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

import tunecache.triton

BENCH_CALLS: list[int] = []
CONFIGS = [triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)]


def median_bench(kernel_call: Any, quantiles: Any = None) -> float:
    """Runs the call once; 3.0, 2.0, 1.0 ms by call order (the third config wins): one float,
    whatever ``quantiles`` Triton asks for."""
    BENCH_CALLS.append(1)
    kernel_call()
    return 3.0 - (len(BENCH_CALLS) - 1) % 3


@tunecache.triton.autotune(configs=CONFIGS, key=["n"], do_bench=median_bench)
@triton.jit
def shift(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 3.0, mask=mask)


def launch(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    n = x.numel()
    shift[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
    return y
