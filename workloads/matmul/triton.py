"""Triton kernel for ``matmul``: C = A @ B, the matmul tutorial's grouped-M tiled GEMM.

Each program computes one ``BLOCK_M × BLOCK_N`` tile of C, accumulating in fp32 over K in steps
of ``BLOCK_K``; program ids are remapped so ``GROUP_M`` tile rows share B columns in L2. Edge
tiles wrap their A and B loads (``% M``, ``% N``, as the tutorial) and mask K and the store.
float32 operands use ``tl.dot(input_precision="tf32x3")`` (about fp32 accuracy on tensor cores;
plain tf32 misses the float32 tolerance); the output has the inputs' dtype.

The same kernel serves ``bias_gelu``: its ``EPILOGUE`` meta-parameter fuses the bias add and the
exact GELU, ``0.5·y·(1 + erf(y/√2))`` (``tl.math.erf``, fp32; in Triton 3.6 and 3.9), into the
tile before the store, as the matmul tutorial fuses its activation.

Split-K (``SPLIT_K`` > 1, for decode-shaped GEMMs whose few output tiles leave SMs idle): the grid
gains a second axis; program ``(tile, s)`` accumulates its tile over the ``s``-th K-slice (a
multiple of ``BLOCK_K`` long) in fp32 and stores the partial sum in an fp32 workspace
``[SPLIT_K, M, N]``; a second, small launch sums the slices in a fixed order, applies the epilogue
once and casts once. The result is deterministic (no atomics). Atomics into a zeroed workspace
would save the workspace's write and read, which at the shapes where splitting helps (M ≤ 64) is
a few MB against the tens of MB of weights every variant reads, so the space offers only this one.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
import triton.language as tl

from tunecache.settings import interpret_enabled
from tunecache.space import Config
from workloads.triton_kit.jit import lazy_jit
from workloads.triton_kit.launch import output_buffer
from workloads.triton_kit.spaces import gemm_default as default_config
from workloads.triton_kit.spaces import gemm_space as space

__all__ = ["default_config", "gemm", "launch", "launch_meta", "space"]

FP32_DOT_PRECISION = "tf32x3"


@lazy_jit
def matmul_kernel(
    a_ptr, b_ptr, bias_ptr, c_ptr, ws_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, EPILOGUE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(axis=0)
    pid_k = tl.program_id(axis=1)
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
    # This program's K-slice: all of K without split-K.
    k_slice = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_start = pid_k * k_slice
    k_stop = tl.minimum(K, k_start + k_slice)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + (k_start + offs_k)[None, :] * stride_ak)
    b_ptrs = b_ptr + ((k_start + offs_k)[:, None] * stride_bk + offs_bn[None, :] * stride_bn)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_start, k_stop, BLOCK_K):
        k_left = k_stop - k
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
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    if SPLIT_K == 1:
        if EPILOGUE == "bias_gelu":
            bias = tl.load(bias_ptr + offs_cn, mask=offs_cn < N, other=0.0).to(tl.float32)
            acc = acc + bias[None, :]
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)
    else:  # the partial sum of this slice; split_k_reduce_kernel finishes
        ws_ptrs = ws_ptr + pid_k * M * N + offs_cm[:, None] * N + offs_cn[None, :]
        tl.store(ws_ptrs, acc, mask=c_mask)


@lazy_jit
def split_k_reduce_kernel(
    ws_ptr, bias_ptr, c_ptr, M, N, stride_cm, stride_cn,
    SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, EPILOGUE: tl.constexpr,
):  # fmt: skip
    """C = epilogue(Σ_s workspace[s]), summed in slice order (deterministic), cast once."""
    offs = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * M * N + offs, mask=mask, other=0.0)
    row = offs // N
    col = offs % N
    if EPILOGUE == "bias_gelu":
        acc = acc + tl.load(bias_ptr + col, mask=mask, other=0.0).to(tl.float32)
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    tl.store(c_ptr + row * stride_cm + col * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=mask)


REDUCE_BLOCK = 1024


class LaunchMeta(NamedTuple):
    block_m: int
    block_n: int
    split_k: int
    kwargs: dict[str, Any]


@functools.lru_cache(maxsize=1024)
def launch_meta(config: Config, dtype: torch.dtype, epilogue: str, interpret: bool) -> LaunchMeta:
    """``config``'s tiles and the kernel's keyword arguments, worked out once per config (a
    decode GEMM runs in about 20 µs on an H200: the host must not spend longer preparing it)."""
    split = int(config.get("SPLIT_K", 1))  # records tuned before split-K have none
    block_m, block_n = int(config["BLOCK_M"]), int(config["BLOCK_N"])
    kwargs = {
        "BLOCK_M": block_m, "BLOCK_N": block_n,
        "BLOCK_K": int(config["BLOCK_K"]), "GROUP_M": int(config["GROUP_M"]), "SPLIT_K": split,
        "DOT_PRECISION": FP32_DOT_PRECISION if dtype == torch.float32 else "tf32",
        "DOT_IN_FP32": dtype == torch.bfloat16 and interpret, "EPILOGUE": epilogue,
        "num_warps": int(config["num_warps"]), "num_stages": int(config["num_stages"]),
    }  # fmt: skip
    return LaunchMeta(block_m, block_n, split, kwargs)


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
    epilogue = "none" if bias is None else "bias_gelu"
    meta = launch_meta(config, a.dtype, epilogue, interpret_enabled())
    split = meta.split_k
    bias_arg = c if bias is None else bias  # no bias: a pointer never read
    ws = c if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=a.device)
    grid = (-(-m // meta.block_m) * -(-n // meta.block_n), split)
    matmul_kernel[grid](
        a, b, bias_arg, c, ws, m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        **meta.kwargs,
    )  # fmt: skip
    if split > 1:
        split_k_reduce_kernel[(-(-m * n // REDUCE_BLOCK),)](
            ws, bias_arg, c, m, n, c.stride(0), c.stride(1),
            SPLIT_K=split, BLOCK=REDUCE_BLOCK, EPILOGUE=epilogue, num_warps=4,
        )  # fmt: skip
    return c


def launch(
    config: Config, a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """C = A @ B with ``config``'s tiles, into ``out`` or a new tensor on A's device in A's
    dtype; returns C."""
    return gemm(config, a, b, out=out)
