"""The start-up bench's kernel: the Triton matmul tutorial's GEMM under three autotuners.

``cached`` is ``tunecache.triton.autotune`` (winners from the cache server in
``$TUNECACHE_URL``), ``verified`` the same with ``verify="first"``, ``plain`` is
``triton.autotune``; all wrap the same ``@triton.jit`` function, so they share Triton's
compiled-kernel cache on disk, and all benchmark through :func:`counting_bench` (Triton's
``do_bench``, counted).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
import triton.testing

import tunecache.triton
from workloads.triton_kit.spaces import TUTORIAL_GEMM_CONFIGS

BENCH_CALLS: list[int] = []
CONFIGS = [  # the matmul tutorial's eight
    triton.Config(
        {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": g}, num_stages=s, num_warps=w
    )
    for m, n, k, g, s, w in TUTORIAL_GEMM_CONFIGS
]


def counting_bench(fn: Any, *args: Any, **kwargs: Any) -> Any:
    BENCH_CALLS.append(1)
    return triton.testing.do_bench(fn, *args, **kwargs)


@triton.jit
def gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):  # fmt: skip
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group_id = pid // (GROUP_M * num_pid_n)
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % (GROUP_M * num_pid_n)) % group_size_m)
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_size_m
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


def reference(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, *args: Any) -> None:
    c.copy_(a @ b)


cached = tunecache.triton.autotune(configs=CONFIGS, key=["M", "N", "K"], do_bench=counting_bench,
                                   reference=reference)(gemm_kernel)  # fmt: skip
# The same, each served config checked against ``reference`` at its first launch in the process.
verified = tunecache.triton.autotune(configs=CONFIGS, key=["M", "N", "K"],
                                     do_bench=counting_bench, reference=reference,
                                     verify="first")(gemm_kernel)  # fmt: skip
plain = triton.autotune(configs=CONFIGS, key=["M", "N", "K"], do_bench=counting_bench)(gemm_kernel)


def launch(tuner: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    m, k = a.shape
    _, n = b.shape
    c = torch.empty((m, n), device=a.device, dtype=a.dtype)
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
    tuner[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                c.stride(0), c.stride(1))  # fmt: skip
    return c
