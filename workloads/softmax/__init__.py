"""``softmax``: row-wise softmax of X[M, N] over N."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from tunecache import builtin
from workloads.base import Workload

if TYPE_CHECKING:
    import torch


class Softmax(Workload):
    spec = builtin.SOFTMAX
    tvm_knobs = "rows"
    # Logits of magnitude up to 8: a kernel that forgets to subtract the row max still
    # passes at magnitude 1 but loses precision here.
    input_scale = 8.0
    demo_problem = {"M": 256, "N": 1024}

    def torch_fn(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.softmax(dim=-1)

    def reference(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.double().softmax(dim=-1)

    def flops(self, problem: Mapping[str, int]) -> int:
        # max, subtract, exp, sum, divide: about 5 operations per element.
        return 5 * problem["M"] * problem["N"]
