"""TVM tensor-expression compute for ``bias_gelu``: Y = GELU(X @ W + b), exact erf GELU."""

from __future__ import annotations

import math
from collections.abc import Mapping

from tvm import te, tirx


def compute(problem: Mapping[str, int], dtype: str) -> list[te.Tensor]:
    """The placeholders ``X``, ``W``, ``b`` and the output ``Y`` (in that order)."""
    m, n, k = problem["M"], problem["N"], problem["K"]
    x = te.placeholder((m, k), dtype, name="X")
    w = te.placeholder((k, n), dtype, name="W")
    b = te.placeholder((n,), dtype, name="b")
    r = te.reduce_axis((0, k), name="k")
    mm = te.compute((m, n), lambda i, j: te.sum(x[i, r] * w[r, j], axis=r), name="matmul")
    half = tirx.const(0.5, dtype)
    one = tirx.const(1.0, dtype)
    inv_sqrt2 = tirx.const(1.0 / math.sqrt(2.0), dtype)

    def gelu(i: tirx.PrimExpr, j: tirx.PrimExpr) -> tirx.PrimExpr:
        y = mm[i, j] + b[j]
        return half * y * (one + te.erf(y * inv_sqrt2))

    out = te.compute((m, n), gelu, name="Y")
    return [x, w, b, out]
