"""``bias_gelu``: Y = GELU(X @ W + b), the linear layer with its epilogue fused."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from tunecache import builtin
from workloads.base import Workload

if TYPE_CHECKING:
    import torch


class BiasGelu(Workload):
    spec = builtin.BIAS_GELU
    tvm_knobs = "gemm"
    demo_problem = {"M": 128, "N": 128, "K": 128}

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
