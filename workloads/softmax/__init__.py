"""``softmax``: row-wise softmax of X[M, N] over N."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from workloads.base import Workload, random_nonzero

if TYPE_CHECKING:
    import torch


class Softmax(Workload):
    name = "softmax"
    description = "Y = softmax(X, dim=-1) (X: M×N)"
    params = ("M", "N")
    backends = ("tvm", "inductor", "triton")
    demo_problem = {"M": 256, "N": 1024}

    def input_shapes(self, problem: Mapping[str, int]) -> tuple[tuple[int, ...], ...]:
        return ((problem["M"], problem["N"]),)

    def make_inputs(
        self, problem: Mapping[str, int], dtype: str, seed: int
    ) -> tuple[torch.Tensor, ...]:
        import torch

        # Logits of magnitude up to 8: a kernel that forgets to subtract the row max still
        # passes at magnitude 1 but loses precision here.
        generator = torch.Generator().manual_seed(seed)
        return (random_nonzero((problem["M"], problem["N"]), dtype, generator, scale=8.0),)

    def output_shape(self, problem: Mapping[str, int]) -> tuple[int, ...]:
        return problem["M"], problem["N"]

    def torch_fn(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.softmax(dim=-1)

    def reference(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.double().softmax(dim=-1)

    def flops(self, problem: Mapping[str, int]) -> int:
        # max, subtract, exp, sum, divide: about 5 operations per element.
        return 5 * problem["M"] * problem["N"]
