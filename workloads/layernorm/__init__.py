"""``layernorm``: Y = (X − mean) / sqrt(var + eps) · weight + bias over the last dimension."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from workloads.base import Workload, random_nonzero

if TYPE_CHECKING:
    import torch

EPS = 1e-5


class LayerNorm(Workload):
    name = "layernorm"
    description = "Y = layer_norm(X, (N,), weight, bias, eps=1e-5) (X: M×N)"
    params = ("M", "N")
    backends = ("tvm", "inductor", "triton")
    demo_problem = {"M": 256, "N": 1024}

    def input_shapes(self, problem: Mapping[str, int]) -> tuple[tuple[int, ...], ...]:
        return (problem["M"], problem["N"]), (problem["N"],), (problem["N"],)

    def make_inputs(
        self, problem: Mapping[str, int], dtype: str, seed: int
    ) -> tuple[torch.Tensor, ...]:
        import torch

        generator = torch.Generator().manual_seed(seed)
        m, n = problem["M"], problem["N"]
        # An offset mean per row: one-pass E[x²] − E[x]² variance loses digits here.
        x = random_nonzero((m, n), "float64", generator) + 4.0
        weight = random_nonzero((n,), "float64", generator)
        bias = random_nonzero((n,), "float64", generator)
        dt = torch.float64 if dtype == "float64" else getattr(torch, dtype)
        return x.to(dt), weight.to(dt), bias.to(dt)

    def output_shape(self, problem: Mapping[str, int]) -> tuple[int, ...]:
        return problem["M"], problem["N"]

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
