"""Triton kernel for ``bias_gelu``: Y = GELU(X @ W + b), bias and exact GELU in the epilogue.

The GEMM is ``workloads.matmul.triton``'s grouped-M kernel with its ``bias_gelu`` epilogue, and
the same config space and default (the spec in :mod:`tunecache.builtin` puts that file in this
workload's source hash).
"""

from __future__ import annotations

import torch

from tunecache.space import Config
from workloads.matmul.triton import default_config, gemm, space

__all__ = ["default_config", "launch", "space"]


def launch(
    config: Config,
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """GELU(A @ B + bias) with ``config``'s tiles, into ``out`` or a new tensor on A's device in
    A's dtype; returns it."""
    return gemm(config, a, b, bias, out=out)
