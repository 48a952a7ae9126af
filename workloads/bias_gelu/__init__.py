"""``bias_gelu``: Y = GELU(X @ W + b), the linear layer with its epilogue fused."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from workloads.base import Workload

if TYPE_CHECKING:
    import torch


class BiasGelu(Workload):
    name = "bias_gelu"
    description = "Y = gelu(X @ W + b) (X: M×K, W: K×N, b: N; exact erf GELU)"
    params = ("M", "N", "K")
    backends = ("tvm", "inductor", "triton")
    demo_problem = {"M": 128, "N": 128, "K": 128}
    shared_sources = {"triton": ("matmul/triton.py",)}  # the GEMM kernel with a fused epilogue

    def input_shapes(self, problem: Mapping[str, int]) -> tuple[tuple[int, ...], ...]:
        return (problem["M"], problem["K"]), (problem["K"], problem["N"]), (problem["N"],)

    def output_shape(self, problem: Mapping[str, int]) -> tuple[int, ...]:
        return problem["M"], problem["N"]

    def torch_fn(  # type: ignore[override]
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor
    ) -> torch.Tensor:
        import torch.nn.functional as F

        return F.gelu(x @ w + b)

    def reference(  # type: ignore[override]
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor
    ) -> torch.Tensor:
        import torch

        y = x.double() @ w.double() + b.double()
        return 0.5 * y * (1.0 + torch.erf(y / 2.0**0.5))

    def flops(self, problem: Mapping[str, int]) -> int:
        m, n, k = problem["M"], problem["N"], problem["K"]
        return 2 * m * n * k + 10 * m * n  # GEMM, bias and the erf GELU
