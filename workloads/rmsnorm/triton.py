"""Triton kernel for ``rmsnorm``: Y = X / sqrt(mean(X², −1) + 1e-6) · weight, in fp32.

Each program normalises ``ROWS_PER_PROGRAM`` rows as one 2-D tile. When ``BLOCK_N`` covers the
row (``ONE_TILE``) the rows stay in registers; otherwise the kernel loops over the row twice (sum
of squares, then scale and write). Rows past M are clamped on load and masked on store.
"""

from __future__ import annotations

import torch
import triton.language as tl

from tunecache.space import Config
from workloads.rmsnorm import EPS
from workloads.triton_kit.jit import lazy_jit
from workloads.triton_kit.launch import launch_rows, row_tile
from workloads.triton_kit.norm import load_cols, load_vector, store_cols
from workloads.triton_kit.spaces import row_default as default_config
from workloads.triton_kit.spaces import row_space as space

__all__ = ["default_config", "launch", "space"]


@lazy_jit
def rmsnorm_kernel(
    x_ptr, y_ptr, M, N, stride_xm, stride_ym, w_ptr, eps,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, ONE_TILE: tl.constexpr,
):  # fmt: skip
    x_rows, y_rows, row_ok, cols = row_tile(x_ptr, y_ptr, M, stride_xm, stride_ym, ROWS, BLOCK_N)
    if ONE_TILE:
        x, col_ok = load_cols(x_rows, cols, N)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
        w = load_vector(w_ptr, cols, N)
        store_cols(y_rows, cols, x * rstd[:, None] * w[None, :], row_ok, col_ok)
    else:
        acc = tl.zeros((ROWS, BLOCK_N), tl.float32)
        for start in range(0, N, BLOCK_N):
            x, _ = load_cols(x_rows, start + cols, N)
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / N + eps)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            x, col_ok = load_cols(x_rows, c, N)
            w = load_vector(w_ptr, c, N)
            store_cols(y_rows, c, x * rstd[:, None] * w[None, :], row_ok, col_ok)


def launch(
    config: Config, x: torch.Tensor, weight: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """X / sqrt(mean(X², −1) + 1e-6) · weight with ``config``, into ``out`` or a new tensor like
    X; returns it."""
    return launch_rows(rmsnorm_kernel, config, x, weight.contiguous(), EPS, out=out)
