"""What the workloads' Triton kernels share: the output buffer, and the row kernels' tiling.

Every kernel's ``launch(config, *inputs, out=None)`` writes into ``out`` when given one (so a
caller can fill it with NaN first and see which elements a kernel never wrote), else into a new
tensor: :func:`output_buffer` checks or allocates it.

The row kernels (``softmax``, ``layernorm``, ``rmsnorm``) share their signature's head, their
addressing and their launch: each is ``kernel(x_ptr, y_ptr, M, N, stride_xm, stride_ym, *params,
BLOCK_N, ROWS, ONE_TILE)`` and normalises ``ROWS`` rows of X per program as one 2-D tile
(:func:`row_tile` addresses it; :func:`launch_rows` launches it). Only their math differs.

This file defines part of those kernels: it belongs in their workloads' source hash.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from tunecache.space import Config


def output_buffer(
    out: torch.Tensor | None, shape: tuple[int, ...], like: torch.Tensor
) -> torch.Tensor:
    """``out`` if it can take a kernel's output of ``shape`` in ``like``'s dtype on its device,
    or a new tensor when ``out`` is ``None``.

    Raises:
        ValueError: ``out`` has another shape, dtype or device, or is not contiguous.
    """
    if out is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    problems = []
    if tuple(out.shape) != tuple(shape):
        problems.append(f"shape {tuple(out.shape)}, not {tuple(shape)}")
    if out.dtype != like.dtype:
        problems.append(f"dtype {out.dtype}, not {like.dtype}")
    if out.device != like.device:
        problems.append(f"device {out.device}, not the inputs' {like.device}")
    if not out.is_contiguous():
        problems.append(f"strides {out.stride()}, not contiguous")
    if problems:
        raise ValueError(f"out has {'; '.join(problems)}")
    return out


def _jit_like_triton(fn: Callable[..., Any]) -> Any:
    """``triton.jit(fn)`` in the mode Triton's own helpers (``tl.sum``) were jitted in.

    A helper is jitted when this module is imported, not lazily as the kernels calling it are
    (:mod:`workloads.triton_kit.jit`). Those kernels launch only in the mode of Triton's helpers
    (:func:`workloads.triton_kit.jit.mode_mismatch`), so a helper jitted in that mode, whatever
    ``TRITON_INTERPRET`` says now, always matches its callers.
    """
    if isinstance(tl.standard.cdiv, triton.runtime.JITFunction):
        return triton.runtime.JITFunction(fn)
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(fn)


@_jit_like_triton
def row_tile(x_ptr, y_ptr, M, stride_xm, stride_ym, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's ``ROWS`` rows: ``(x_rows, y_rows, row_ok, cols)``.

    ``x_rows`` and ``y_rows`` point at the rows' starts (a column of pointers), ``row_ok`` says
    which rows exist, ``cols`` is ``0 … BLOCK_N − 1``. Rows past ``M`` read the last row (so no
    lane sees an empty row) and must be masked with ``row_ok`` on store.
    """
    rows = tl.program_id(axis=0) * ROWS + tl.arange(0, ROWS)
    safe_rows = tl.minimum(rows, M - 1).to(tl.int64)
    x_rows = x_ptr + safe_rows[:, None] * stride_xm
    y_rows = y_ptr + rows.to(tl.int64)[:, None] * stride_ym
    return x_rows, y_rows, rows < M, tl.arange(0, BLOCK_N)


@functools.lru_cache(maxsize=1024)
def row_meta(config: Config) -> tuple[int, int, int, int]:
    """``(BLOCK_N, ROWS_PER_PROGRAM, num_warps, num_stages)`` of a row kernel's ``config``, worked
    out once per config: off the per-call path, which a short kernel cannot hide."""
    return (int(config["BLOCK_N"]), int(config["ROWS_PER_PROGRAM"]), int(config["num_warps"]),
            int(config["num_stages"]))  # fmt: skip


def launch_rows(
    kernel: Any, config: Config, x: torch.Tensor, *params: Any, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Runs row kernel ``kernel`` over X (M×N) with ``config``; ``params`` follow the strides.

    Tensor ``params`` must be contiguous. Writes into ``out`` (see :func:`output_buffer`) or a
    new tensor like X, and returns it.
    """
    x = x.contiguous()
    m, n = x.shape
    y = output_buffer(out, (m, n), x)
    block, rows, warps, stages = row_meta(config)
    kernel[(-(-m // rows),)](
        x, y, m, n, x.stride(0), y.stride(0), *params,
        BLOCK_N=block, ROWS=rows, ONE_TILE=block >= n, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return y
