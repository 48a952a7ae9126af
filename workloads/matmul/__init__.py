"""``matmul``: C[M, N] = A[M, K] @ B[K, N]."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from tunecache import builtin
from workloads.base import Workload

if TYPE_CHECKING:
    import torch


class Matmul(Workload):
    spec = builtin.MATMUL
    tvm_knobs = "gemm"
    demo_problem = {"M": 128, "N": 128, "K": 128}

    def torch_fn(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return a @ b

    def reference(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return a.double() @ b.double()

    def flops(self, problem: Mapping[str, int]) -> int:
        return 2 * problem["M"] * problem["N"] * problem["K"]
