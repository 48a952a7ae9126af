"""TVM tensor-expression compute for ``layernorm`` over the last dimension (eps = 1e-5).

Two passes, as the reference: the mean first, then the mean of squared deviations from it.
"""

from __future__ import annotations

from collections.abc import Mapping

from tvm import te, tirx

from workloads.layernorm import EPS


def compute(problem: Mapping[str, int], dtype: str) -> list[te.Tensor]:
    """The placeholders ``X``, ``weight``, ``bias`` and the output ``Y`` (in that order)."""
    m, n = problem["M"], problem["N"]
    x = te.placeholder((m, n), dtype, name="X")
    weight = te.placeholder((n,), dtype, name="weight")
    bias = te.placeholder((n,), dtype, name="bias")
    inv_n = tirx.const(1.0 / n, dtype)
    k1 = te.reduce_axis((0, n), name="k1")
    mean = te.compute((m,), lambda i: te.sum(x[i, k1] * inv_n, axis=k1), name="mean")
    k2 = te.reduce_axis((0, n), name="k2")
    var = te.compute(
        (m,),
        lambda i: te.sum((x[i, k2] - mean[i]) * (x[i, k2] - mean[i]) * inv_n, axis=k2),
        name="var",
    )
    eps = tirx.const(EPS, dtype)
    y = te.compute(
        (m, n),
        lambda i, j: (x[i, j] - mean[i]) / te.sqrt(var[i] + eps) * weight[j] + bias[j],
        name="Y",
    )
    return [x, weight, bias, y]
