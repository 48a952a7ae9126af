"""Triton kernel for ``bias_gelu``: Y = GELU(X @ W + b), bias and exact GELU in the epilogue.

The GEMM is ``workloads.matmul.triton``'s grouped-M kernel with its ``bias_gelu`` epilogue, and
the same config space and default (:attr:`BiasGelu.shared_sources` puts that file in this
workload's source hash).
"""

from __future__ import annotations

import torch

from tunecache.space import Config
from workloads.matmul.triton import default_config, gemm, space

__all__ = ["default_config", "launch", "space"]


def launch(config: Config, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """GELU(A @ B + bias) with ``config``'s tiles; a new tensor on A's device in A's dtype."""
    return gemm(config, a, b, bias)
