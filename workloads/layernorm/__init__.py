"""``layernorm``: Y = (X − mean) / sqrt(var + eps) · weight + bias over the last dimension."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from tunecache import builtin
from workloads.base import Workload

if TYPE_CHECKING:
    import torch

EPS = 1e-5


class LayerNorm(Workload):
    spec = builtin.LAYERNORM
    tvm_knobs = "rows"
    # An offset mean per row: one-pass E[x²] − E[x]² variance loses digits here.
    input_offset = 4.0
    demo_problem = {"M": 256, "N": 1024}

    def torch_fn(  # type: ignore[override]
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        import torch.nn.functional as F

        return F.layer_norm(x, (x.shape[-1],), weight, bias, EPS)

    def reference(  # type: ignore[override]
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        x = x.double()
        mean = x.mean(dim=-1, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
        return (x - mean) / (var + EPS).sqrt() * weight.double() + bias.double()

    def flops(self, problem: Mapping[str, int]) -> int:
        return 8 * problem["M"] * problem["N"]
