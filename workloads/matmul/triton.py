"""Triton kernel for ``matmul``: C = A @ B, the matmul tutorial's grouped-M tiled GEMM.

Each program computes one ``BLOCK_M × BLOCK_N`` tile of C, accumulating in fp32 over K in steps
of ``BLOCK_K``; program ids are remapped so ``GROUP_M`` tile rows share B columns in L2. Edge
tiles wrap their A and B loads (``% M``, ``% N``, as the tutorial) and mask K and the store.
float32 operands use ``tl.dot(input_precision="tf32x3")`` (about fp32 accuracy on tensor cores;
plain tf32 misses the float32 tolerance); the output has the inputs' dtype.

The same kernel serves ``bias_gelu``: its ``EPILOGUE`` meta-parameter fuses the bias add and the
exact GELU, ``0.5·y·(1 + erf(y/√2))`` (``tl.math.erf``, fp32; in Triton 3.6 and 3.9), into the
tile before the store, as the matmul tutorial fuses its activation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from backends.triton.jit import lazy_jit
from backends.triton.launch import output_buffer
from backends.triton.settings import interpret_enabled
from backends.triton.spaces import gemm_default as default_config
from backends.triton.spaces import gemm_space as space
from tunecache.space import Config

__all__ = ["default_config", "dot_options", "gemm", "launch", "space"]

FP32_DOT_PRECISION = "tf32x3"


@lazy_jit
def matmul_kernel(
    a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, EPILOGUE: tl.constexpr,
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

    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if EPILOGUE == "bias_gelu":
        bias = tl.load(bias_ptr + offs_cn, mask=offs_cn < N, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


def dot_options(dtype: torch.dtype) -> dict[str, object]:
    """The ``DOT_PRECISION`` and ``DOT_IN_FP32`` meta-parameters for operands of ``dtype``."""
    return {
        "DOT_PRECISION": FP32_DOT_PRECISION if dtype == torch.float32 else "tf32",
        "DOT_IN_FP32": dtype == torch.bfloat16 and interpret_enabled(),
    }


def gemm(
    config: Config,
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """A @ B, or GELU(A @ B + bias) with ``bias``, with ``config``'s tiles.

    Writes into ``out`` (M×N, A's dtype, contiguous on A's device) or a new tensor, and returns
    it.

    Raises:
        ValueError: the operands do not fit together, or ``out`` does not fit them.
    """
    m, k = a.shape
    k_b, n = b.shape
    if (
        k != k_b
        or a.dtype != b.dtype
        or (bias is not None and (tuple(bias.shape) != (n,) or bias.dtype != a.dtype))
    ):
        extra = "" if bias is None else f" and bias {tuple(bias.shape)} {bias.dtype}"
        raise ValueError(
            f"GEMM of {tuple(a.shape)} {a.dtype} and {tuple(b.shape)} {b.dtype}{extra}"
        )
    c = output_buffer(out, (m, n), a)
    bm, bn = int(config["BLOCK_M"]), int(config["BLOCK_N"])
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    matmul_kernel[grid](
        a, b, c if bias is None else bias, c, m, n, k,  # no bias: a pointer never read
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=int(config["BLOCK_K"]), GROUP_M=int(config["GROUP_M"]),
        **dot_options(a.dtype), EPILOGUE="none" if bias is None else "bias_gelu",
        num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]),
    )  # fmt: skip
    return c


def launch(
    config: Config, a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """C = A @ B with ``config``'s tiles, into ``out`` or a new tensor on A's device in A's
    dtype; returns C."""
    return gemm(config, a, b, out=out)
