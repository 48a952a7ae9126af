"""Triton kernel for ``layernorm``: Y = (X − mean) / sqrt(var + 1e-5) · weight + bias, in fp32.

Two-pass statistics, as the reference: the mean first, then the mean of squared deviations from
it (one-pass E[x²] − E[x]² loses digits on the workload's offset rows). Each program normalises
``ROWS_PER_PROGRAM`` rows as one 2-D tile. When ``BLOCK_N`` covers the row (``ONE_TILE``) the rows
stay in registers; otherwise the kernel loops over the row three times (sum, squared deviations,
normalise and write), as Triton's layer-norm tutorial does. Rows past M are clamped on load and
masked on store.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from backends.triton.jit import lazy_jit
from backends.triton.limits import DeviceLimits, current_limits
from backends.triton.spaces import row_default, row_space
from tunecache.space import Config, SearchSpace
from workloads.layernorm import EPS


@lazy_jit
def layernorm_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, M, N, stride_xm, stride_ym, eps,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, ONE_TILE: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(axis=0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    safe_rows = tl.minimum(rows, M - 1).to(tl.int64)
    x_rows = x_ptr + safe_rows[:, None] * stride_xm
    y_rows = y_ptr + rows.to(tl.int64)[:, None] * stride_ym
    cols = tl.arange(0, BLOCK_N)
    if ONE_TILE:
        col_ok = cols[None, :] < N
        x = tl.load(x_rows + cols[None, :], mask=col_ok, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / N
        diff = tl.where(col_ok, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=1) / N + eps)
        w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        y = diff * rstd[:, None] * w[None, :] + b[None, :]
        tl.store(
            y_rows + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok
        )
    else:
        acc = tl.zeros((ROWS, BLOCK_N), tl.float32)
        for start in range(0, N, BLOCK_N):
            col_ok = (start + cols)[None, :] < N
            acc += tl.load(x_rows + start + cols[None, :], mask=col_ok, other=0.0).to(tl.float32)
        mean = tl.sum(acc, axis=1) / N
        acc = tl.zeros((ROWS, BLOCK_N), tl.float32)
        for start in range(0, N, BLOCK_N):
            col_ok = (start + cols)[None, :] < N
            x = tl.load(x_rows + start + cols[None, :], mask=col_ok, other=0.0).to(tl.float32)
            diff = tl.where(col_ok, x - mean[:, None], 0.0)
            acc += diff * diff
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / N + eps)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            col_ok = c[None, :] < N
            x = tl.load(x_rows + c[None, :], mask=col_ok, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + c, mask=c < N, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + c, mask=c < N, other=0.0).to(tl.float32)
            y = (x - mean[:, None]) * rstd[:, None] * w[None, :] + b[None, :]
            tl.store(
                y_rows + c[None, :], y.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok
            )


def space(problem: Mapping[str, int], dtype: str, limits: DeviceLimits) -> SearchSpace:
    """Row block, rows per program, warps and stages (see :mod:`backends.triton.spaces`)."""
    return row_space(problem, dtype, limits)


def default_config(
    problem: Mapping[str, int], dtype: str, limits: DeviceLimits | None = None
) -> Config:
    """The layer-norm tutorial's heuristic: a block covering the row, warps by block size."""
    return row_default(problem, dtype, limits or current_limits())


def launch(
    config: Config, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """layer_norm(X, (N,), weight, bias, eps=1e-5) with ``config``; a new tensor like X."""
    x, weight, bias = x.contiguous(), weight.contiguous(), bias.contiguous()
    m, n = x.shape
    y = torch.empty_like(x)
    block, rows = int(config["BLOCK_N"]), int(config["ROWS_PER_PROGRAM"])
    layernorm_kernel[(triton.cdiv(m, rows),)](
        x, weight, bias, y, m, n, x.stride(0), y.stride(0), EPS,
        BLOCK_N=block, ROWS=rows, ONE_TILE=block >= n,
        num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]),
    )  # fmt: skip
    return y
