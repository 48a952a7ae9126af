"""Triton kernel for ``softmax``: row-wise softmax with the row max subtracted, in fp32.

Each program normalises ``ROWS_PER_PROGRAM`` rows as one 2-D tile. When ``BLOCK_N`` covers the
row (``ONE_TILE``) the rows stay in registers, as in Triton's fused-softmax tutorial: one read,
one write. Otherwise the kernel loops over the row twice: an online pass keeps a running max and
a rescaled running sum per lane, then a second pass writes ``exp(x − max) / sum``. Rows past M
are clamped to the last row on load and masked on store, so no lane ever sees an empty row.
"""

from __future__ import annotations

import torch
import triton.language as tl

from tunecache.space import Config
from workloads.triton_kit.jit import lazy_jit
from workloads.triton_kit.launch import launch_rows, row_tile
from workloads.triton_kit.spaces import row_default as default_config
from workloads.triton_kit.spaces import row_space as space

__all__ = ["default_config", "launch", "space"]


@lazy_jit
def softmax_kernel(
    x_ptr, y_ptr, M, N, stride_xm, stride_ym,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, ONE_TILE: tl.constexpr,
):  # fmt: skip
    x_rows, y_rows, row_ok, cols = row_tile(x_ptr, y_ptr, M, stride_xm, stride_ym, ROWS, BLOCK_N)
    if ONE_TILE:
        col_ok = cols[None, :] < N
        x = tl.load(x_rows + cols[None, :], mask=col_ok, other=-float("inf")).to(tl.float32)
        num = tl.exp(x - tl.max(x, axis=1)[:, None])
        y = num / tl.sum(num, axis=1)[:, None]
        tl.store(
            y_rows + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok
        )
    else:
        # N > BLOCK_N here, so every lane sees a real element in the first tile.
        run_max = tl.full((ROWS, BLOCK_N), -float("inf"), tl.float32)
        run_sum = tl.zeros((ROWS, BLOCK_N), tl.float32)
        for start in range(0, N, BLOCK_N):
            col_ok = (start + cols)[None, :] < N
            x = tl.load(x_rows + start + cols[None, :], mask=col_ok, other=-float("inf"))
            x = x.to(tl.float32)
            new_max = tl.maximum(run_max, x)
            run_sum = run_sum * tl.exp(run_max - new_max) + tl.exp(x - new_max)
            run_max = new_max
        row_max = tl.max(run_max, axis=1)
        row_sum = tl.sum(run_sum * tl.exp(run_max - row_max[:, None]), axis=1)
        inv_sum = 1.0 / row_sum
        for start in range(0, N, BLOCK_N):
            col_ok = (start + cols)[None, :] < N
            x = tl.load(x_rows + start + cols[None, :], mask=col_ok, other=-float("inf"))
            y = tl.exp(x.to(tl.float32) - row_max[:, None]) * inv_sum[:, None]
            tl.store(y_rows + start + cols[None, :], y.to(y_ptr.dtype.element_ty),
                     mask=row_ok[:, None] & col_ok)  # fmt: skip


def launch(config: Config, x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(X, dim=-1) with ``config``, into ``out`` or a new tensor like X; returns it."""
    return launch_rows(softmax_kernel, config, x, out=out)
