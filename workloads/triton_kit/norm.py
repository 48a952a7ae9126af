"""What the normalising row kernels (``layernorm``, ``rmsnorm``) share: loading a tile's columns
and a weight or bias vector in fp32, and storing a tile, each masked where the row or column
does not exist (:func:`workloads.triton_kit.launch.row_tile` addresses the tile).

This file defines part of those kernels: it belongs in their source hash (and in theirs only,
so another kernel's records stay its own when it changes).
"""

from __future__ import annotations

import triton.language as tl

# jitted in the mode of Triton's own helpers, as row_tile is (see the function)
from workloads.triton_kit.launch import _jit_like_triton


@_jit_like_triton
def load_cols(rows, c, N):
    """Columns ``c`` of a tile's rows (``rows`` point at their starts) in fp32, 0 past ``N``;
    with which columns exist: ``(x, col_ok)``."""
    col_ok = c[None, :] < N
    return tl.load(rows + c[None, :], mask=col_ok, other=0.0).to(tl.float32), col_ok


@_jit_like_triton
def load_vector(ptr, c, N):
    """Entries ``c`` of a length-``N`` vector (a weight, a bias) in fp32, 0 past ``N``."""
    return tl.load(ptr + c, mask=c < N, other=0.0).to(tl.float32)


@_jit_like_triton
def store_cols(y_rows, c, y, row_ok, col_ok):
    """Writes tile ``y`` to columns ``c`` of the rows ``y_rows`` point at, in their dtype, where
    both the row and the column exist."""
    tl.store(y_rows + c[None, :], y.to(y_rows.dtype.element_ty), mask=row_ok[:, None] & col_ok)
