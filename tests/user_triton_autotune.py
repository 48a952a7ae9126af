"""A user's Triton kernel under ``tunecache.triton.autotune``, as a user's module would have it.

Imported by the tests and by the processes they start (``TRITON_INTERPRET=1`` is set before, by
``tests/conftest.py`` or the starting test). ``BENCH_CALLS`` counts Triton's benchmark calls: the
stand-in ``do_bench`` (the interpreter has no device timer) returns times that depend on the call
order only, so the winner is the same config in every process that tunes.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

import tunecache.triton

BENCH_CALLS: list[int] = []
CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)]
ON_MISS: Any = os.environ.get("TEST_ON_MISS", "tune")
# Another process's timings, reversed: without rank 0's broadcast it would pick another config.
REVERSED = os.environ.get("TEST_TIMES") == "reversed"


def counting_bench(kernel_call: Any, quantiles: Any = None) -> list[float]:
    """Runs the call once; 0.03, 0.02, 0.01, 0.03, … ms by call order (the third config wins)."""
    BENCH_CALLS.append(1)
    kernel_call()
    step = (len(BENCH_CALLS) - 1) % 3
    ms = 0.01 * (1 + step if REVERSED else 3 - step)
    return [ms, ms, ms]


def reference(x: torch.Tensor, y: torch.Tensor, n: int) -> None:
    y.copy_(x * 2.0 + 1.0)


@tunecache.triton.autotune(configs=CONFIGS, key=["n"], do_bench=counting_bench,
                           reference=reference, on_miss=ON_MISS)  # fmt: skip
@triton.jit
def affine(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0 + 1.0, mask=mask)


def launch(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    n = x.numel()
    affine[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
    return y


@triton.jit
def dot_tile(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    """One BLOCK x BLOCK tile of A @ B: its shared memory grows with BLOCK."""
    offs = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offs[:, None] * BLOCK + offs[None, :])
    b = tl.load(b_ptr + offs[:, None] * BLOCK + offs[None, :])
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], tl.dot(a, b))


VERIFY: Any = os.environ.get("TEST_VERIFY", "never")


def rows_reference(x: torch.Tensor, y: torch.Tensor, *args: Any) -> None:
    if os.environ.get("TEST_REFERENCE_FAILS"):  # as a process short of device memory sees it
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    y.copy_(x * 2.0 + 1.0)


@tunecache.triton.autotune(configs=CONFIGS[::2], key=["cols"], do_bench=counting_bench,
                           reference=rows_reference, verify=VERIFY)  # fmt: skip
@triton.jit
def affine_rows(x_ptr, y_ptr, cols, stride_x, stride_y, BLOCK: tl.constexpr):
    """Row by row, through the rows' strides: padded views are addressed as their buffers are."""
    row = tl.program_id(0)
    for start in range(0, cols, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < cols
        values = tl.load(x_ptr + row * stride_x + offsets, mask=mask)
        tl.store(y_ptr + row * stride_y + offsets, values * 2.0 + 1.0, mask=mask)


def launch_rows(x: torch.Tensor, y: torch.Tensor) -> None:
    """``y = 2x + 1`` for two row-major views of the same shape, each with its own row stride."""
    rows, cols = x.shape
    affine_rows[(rows,)](x, y, cols, x.stride(0), y.stride(0))


def max_reference(x: torch.Tensor, y: torch.Tensor, cols: int) -> None:
    y.copy_(x.max(dim=1).values)


@tunecache.triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=1) for b in (128, 64, 16)],
                           key=["cols"], do_bench=counting_bench, reference=max_reference,
                           on_miss="tune")  # fmt: skip
@triton.jit
def row_max(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    """A row's max in one pass of BLOCK columns: wrong wherever BLOCK < cols (a user's bug that
    only some configs have), and the third config, the one the timings favour, has it."""
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    values = tl.load(x_ptr + row * cols + offsets, mask=offsets < cols, other=float("-inf"))
    tl.store(y_ptr + row, tl.max(values, axis=0))


def launch_max(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty(x.shape[0], dtype=x.dtype)
    row_max[(x.shape[0],)](x, y, x.shape[1])
    return y
