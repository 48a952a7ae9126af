"""TVM tensor-expression compute for ``matmul``: C[M, N] = A[M, K] @ B[K, N]."""

from __future__ import annotations

from collections.abc import Mapping

from tvm import te


def compute(problem: Mapping[str, int], dtype: str) -> list[te.Tensor]:
    """The placeholders ``A``, ``B`` and the output ``C`` (in that order)."""
    m, n, k = problem["M"], problem["N"], problem["K"]
    a = te.placeholder((m, k), dtype, name="A")
    b = te.placeholder((k, n), dtype, name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return [a, b, c]
