"""``rmsnorm``: Y = X / sqrt(mean(X², −1) + eps) · weight over the last dimension (eps = 1e-6)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from tunecache import builtin
from workloads.base import Workload

if TYPE_CHECKING:
    import torch

EPS = 1e-6


class RMSNorm(Workload):
    spec = builtin.RMSNORM
    tvm_knobs = "rows"
    demo_problem = {"M": 256, "N": 1024}

    def torch_fn(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        import torch.nn.functional as F

        return F.rms_norm(x, (x.shape[-1],), weight, EPS)

    def reference(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        x = x.double()
        return x / (x.pow(2).mean(dim=-1, keepdim=True) + EPS).sqrt() * weight.double()

    def flops(self, problem: Mapping[str, int]) -> int:
        # square, sum, then per element: scale by the row's 1/rms and by the weight.
        return 4 * problem["M"] * problem["N"]
