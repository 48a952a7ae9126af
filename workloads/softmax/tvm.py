"""TVM tensor-expression compute for ``softmax``: row-wise softmax of X[M, N] over N.

The exponential is ``topi.fast_exp`` (a vectorisable polynomial, clamped to the float32 range,
as accurate as libm's ``expf`` here: relative error ~1e-7): plain ``te.exp`` lowers to one scalar
libm call per element on llvm, which no schedule can vectorise and which costs the kernel half
its time.
"""

from __future__ import annotations

from collections.abc import Mapping

from tvm import te, topi


def compute(problem: Mapping[str, int], dtype: str) -> list[te.Tensor]:
    """The placeholder ``X`` and the output ``Y``: row max, exp(x − max), row sum, divide."""
    m, n = problem["M"], problem["N"]
    x = te.placeholder((m, n), dtype, name="X")
    k1 = te.reduce_axis((0, n), name="k1")
    row_max = te.compute((m,), lambda i: te.max(x[i, k1], axis=k1), name="row_max")
    shifted = te.compute((m, n), lambda i, j: x[i, j] - row_max[i], name="shifted")
    exp = topi.fast_exp(shifted)
    k2 = te.reduce_axis((0, n), name="k2")
    row_sum = te.compute((m,), lambda i: te.sum(exp[i, k2], axis=k2), name="row_sum")
    y = te.compute((m, n), lambda i, j: exp[i, j] / row_sum[i], name="Y")
    return [x, y]
