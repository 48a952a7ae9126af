"""Triton kernel for ``bias_gelu``: Y = GELU(X @ W + b), bias and exact GELU in the epilogue.

The GEMM is the matmul tutorial's grouped-M tiled kernel (the same as ``workloads.matmul.triton``,
kept here so this workload's source hash covers it): fp32 accumulation over K, ``GROUP_M`` tile
rows sharing W columns in L2, wrapped loads and masked K and stores at the edges. The epilogue
adds the bias and applies the exact GELU, ``0.5·y·(1 + erf(y/√2))``, with ``tl.math.erf`` (fp32;
present in Triton 3.6 and 3.9) before casting to the inputs' dtype. float32 operands use
``tl.dot(input_precision="tf32x3")``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from backends.triton.jit import lazy_jit
from backends.triton.limits import DeviceLimits, current_limits
from backends.triton.settings import interpret_enabled
from backends.triton.spaces import gemm_default, gemm_space
from tunecache.space import Config, SearchSpace

FP32_DOT_PRECISION = "tf32x3"


@lazy_jit
def bias_gelu_kernel(
    a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        k_left = K - k
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if DOT_IN_FP32:  # the interpreter cannot multiply bfloat16 (it stores raw bits)
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    bias = tl.load(bias_ptr + offs_cn, mask=offs_cn < N, other=0.0).to(tl.float32)
    y = acc + bias[None, :]
    y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))

    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, y.to(c_ptr.dtype.element_ty), mask=c_mask)


def space(problem: Mapping[str, int], dtype: str, limits: DeviceLimits) -> SearchSpace:
    """Tiles, group size, warps and stages, pruned by shared memory, threads and problem size."""
    return gemm_space(problem, dtype, limits)


def default_config(
    problem: Mapping[str, int], dtype: str, limits: DeviceLimits | None = None
) -> Config:
    """The matmul tutorial's first config that fits, as for ``matmul``."""
    return gemm_default(problem, dtype, limits or current_limits())


def dot_options(dtype: torch.dtype) -> dict[str, object]:
    """The ``DOT_PRECISION`` and ``DOT_IN_FP32`` meta-parameters for operands of ``dtype``."""
    return {
        "DOT_PRECISION": FP32_DOT_PRECISION if dtype == torch.float32 else "tf32",
        "DOT_IN_FP32": dtype == torch.bfloat16 and interpret_enabled(),
    }


def launch(config: Config, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """GELU(A @ B + bias) with ``config``'s tiles; a new tensor on A's device in A's dtype."""
    m, k = a.shape
    k_b, n = b.shape
    if k != k_b or tuple(bias.shape) != (n,) or not a.dtype == b.dtype == bias.dtype:
        raise ValueError(
            f"bias_gelu of {tuple(a.shape)} {a.dtype}, {tuple(b.shape)} {b.dtype} "
            f"and bias {tuple(bias.shape)} {bias.dtype}"
        )
    c = torch.empty((m, n), device=a.device, dtype=a.dtype)
    bm, bn = int(config["BLOCK_M"]), int(config["BLOCK_N"])
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    bias_gelu_kernel[grid](
        a, b, bias, c, m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=int(config["BLOCK_K"]), GROUP_M=int(config["GROUP_M"]),
        **dot_options(a.dtype),
        num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]),
    )  # fmt: skip
    return c
