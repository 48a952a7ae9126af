"""Triton kernel for ``layernorm``: Y = (X − mean) / sqrt(var + 1e-5) · weight + bias, in fp32.

Two-pass statistics, as the reference: the mean first, then the mean of squared deviations from
it (one-pass E[x²] − E[x]² loses digits on the workload's offset rows). Each program normalises
``ROWS_PER_PROGRAM`` rows as one 2-D tile. When ``BLOCK_N`` covers the row (``ONE_TILE``) the rows
stay in registers; otherwise the kernel loops over the row three times (sum, squared deviations,
normalise and write), as Triton's layer-norm tutorial does. Rows past M are clamped on load and
masked on store.
"""

from __future__ import annotations

import torch
import triton.language as tl

from tunecache.space import Config
from workloads.layernorm import EPS
from workloads.triton_kit.jit import lazy_jit
from workloads.triton_kit.launch import launch_rows, row_tile
from workloads.triton_kit.norm import load_cols, load_vector, store_cols
from workloads.triton_kit.spaces import row_default as default_config
from workloads.triton_kit.spaces import row_space as space

__all__ = ["default_config", "launch", "space"]


@lazy_jit
def layernorm_kernel(
    x_ptr, y_ptr, M, N, stride_xm, stride_ym, w_ptr, b_ptr, eps,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, ONE_TILE: tl.constexpr,
):  # fmt: skip
    x_rows, y_rows, row_ok, cols = row_tile(x_ptr, y_ptr, M, stride_xm, stride_ym, ROWS, BLOCK_N)
    if ONE_TILE:
        x, col_ok = load_cols(x_rows, cols, N)
        mean = tl.sum(x, axis=1) / N
        diff = tl.where(col_ok, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=1) / N + eps)
        w, b = load_vector(w_ptr, cols, N), load_vector(b_ptr, cols, N)
        store_cols(y_rows, cols, diff * rstd[:, None] * w[None, :] + b[None, :], row_ok, col_ok)
    else:
        acc = tl.zeros((ROWS, BLOCK_N), tl.float32)
        for start in range(0, N, BLOCK_N):
            x, _ = load_cols(x_rows, start + cols, N)
            acc += x
        mean = tl.sum(acc, axis=1) / N
        acc = tl.zeros((ROWS, BLOCK_N), tl.float32)
        for start in range(0, N, BLOCK_N):
            x, col_ok = load_cols(x_rows, start + cols, N)
            diff = tl.where(col_ok, x - mean[:, None], 0.0)
            acc += diff * diff
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / N + eps)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            x, col_ok = load_cols(x_rows, c, N)
            w, b = load_vector(w_ptr, c, N), load_vector(b_ptr, c, N)
            y = (x - mean[:, None]) * rstd[:, None] * w[None, :] + b[None, :]
            store_cols(y_rows, c, y, row_ok, col_ok)


def launch(
    config: Config,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """layer_norm(X, (N,), weight, bias, eps=1e-5) with ``config``, into ``out`` or a new tensor
    like X; returns it."""
    params = (weight.contiguous(), bias.contiguous(), EPS)
    return launch_rows(layernorm_kernel, config, x, *params, out=out)
