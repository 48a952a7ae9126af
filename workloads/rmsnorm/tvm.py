"""TVM tensor-expression compute for ``rmsnorm`` over the last dimension (eps = 1e-6)."""

from __future__ import annotations

from collections.abc import Mapping

from tvm import te, tirx

from workloads.rmsnorm import EPS


def compute(problem: Mapping[str, int], dtype: str) -> list[te.Tensor]:
    """The placeholders ``X``, ``weight`` and the output ``Y`` (in that order)."""
    m, n = problem["M"], problem["N"]
    x = te.placeholder((m, n), dtype, name="X")
    weight = te.placeholder((n,), dtype, name="weight")
    inv_n = tirx.const(1.0 / n, dtype)
    k = te.reduce_axis((0, n), name="k")
    mean_sq = te.compute((m,), lambda i: te.sum(x[i, k] * x[i, k] * inv_n, axis=k), name="mean_sq")
    eps = tirx.const(EPS, dtype)
    y = te.compute((m, n), lambda i, j: x[i, j] / te.sqrt(mean_sq[i] + eps) * weight[j], name="Y")
    return [x, weight, y]
