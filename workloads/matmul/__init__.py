"""``matmul``: C[M, N] = A[M, K] @ B[K, N]."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from workloads.base import Workload

if TYPE_CHECKING:
    import torch


class Matmul(Workload):
    name = "matmul"
    description = "C = A @ B (A: M×K, B: K×N)"
    params = ("M", "N", "K")
    backends = ("tvm", "inductor", "triton")
    demo_problem = {"M": 128, "N": 128, "K": 128}

    def input_shapes(self, problem: Mapping[str, int]) -> tuple[tuple[int, ...], ...]:
        return (problem["M"], problem["K"]), (problem["K"], problem["N"])

    def output_shape(self, problem: Mapping[str, int]) -> tuple[int, ...]:
        return problem["M"], problem["N"]

    def torch_fn(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return a @ b

    def reference(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return a.double() @ b.double()

    def flops(self, problem: Mapping[str, int]) -> int:
        return 2 * problem["M"] * problem["N"] * problem["K"]
