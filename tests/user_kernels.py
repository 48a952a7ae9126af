"""Kernels a user writes in their own module, named ``"tests.user_kernels:ClassName"``.

They are declared the way a user's kernel is (a few class attributes, the math, and a hook per
backend) and go through the same pipeline as the built-ins. ``stand_in_timer`` stands in for a
device timer where the kernel runs in Triton's interpreter (its timings mean nothing).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from tunecache.schemas import TimingModel
from tunecache.space import Config, SearchSpace
from tunecache.timing import TimerSettings
from workloads import Workload


class AffineRows(Workload):
    """y = 2x + 1 over an M×N matrix: Inductor compiles ``torch_fn``, TVM ``tvm_compute``,
    Triton launches ``triton_launch`` (under the interpreter on a CPU machine)."""

    params = ("M", "N")
    inputs = (("M", "N"),)
    output = ("M", "N")
    bucket = ("M",)
    backend_dtypes = {"inductor": ("float32",), "tvm": ("float32",), "triton": ("float32",)}
    demo_problem = {"M": 8, "N": 24}

    def torch_fn(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x * 2.0 + 1.0

    def reference(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.double() * 2.0 + 1.0

    def flops(self, problem: Mapping[str, int]) -> int:
        return 2 * problem["M"] * problem["N"]

    def tvm_compute(self, problem: Mapping[str, int], dtype: str) -> list[Any]:
        from tvm import te

        x = te.placeholder((problem["M"], problem["N"]), dtype, name="X")
        y = te.compute(x.shape, lambda i, j: x[i, j] * 2.0 + 1.0, name="Y")
        return [x, y]

    def triton_space(self, problem: Mapping[str, int], dtype: str, limits: Any) -> SearchSpace:
        return SearchSpace({"BLOCK": (16, 32, 64), "num_warps": (1, 2)})

    def triton_default(self, problem: Mapping[str, int], dtype: str, limits: Any = None) -> Config:
        return Config.of({"BLOCK": 32, "num_warps": 1})

    def triton_launch(
        self, config: Config, x: torch.Tensor, *, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        import triton

        x = x.contiguous()
        y = torch.empty_like(x) if out is None else out
        n, block = x.numel(), int(config["BLOCK"])
        _affine_kernel()[(triton.cdiv(n, block),)](
            x, y, n, BLOCK=block, num_warps=int(config["num_warps"])
        )
        return y


def _affine_kernel() -> Any:
    """The Triton kernel, jitted on first use (Triton's interpreter mode is chosen by then)."""
    global _KERNEL
    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def affine(x_ptr, y_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
            offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < n
            tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0 + 1.0, mask=mask)

        _KERNEL = affine
    return _KERNEL


_KERNEL: Any = None


def stand_in_timer(fn: Callable[[], Any], settings: TimerSettings) -> TimingModel:
    """A stand-in timer for interpreter runs: runs ``fn`` twice, reports a fixed small time."""
    started = time.perf_counter()
    fn()
    fn()
    elapsed = max((time.perf_counter() - started) / 2 * 1e3, 1e-6)
    return TimingModel(median_ms=elapsed, min_ms=elapsed, max_ms=elapsed, repeats=2,
                       timer="test timer (interpreter timings mean nothing)")  # fmt: skip


class NoTvmHook(Workload):
    """Lists tvm among its backends but defines no ``tvm_compute`` (and this module has no
    ``tvm`` module beside it): a user's slip, said as such."""

    params = ("M",)
    inputs = (("M",),)
    output = ("M",)
    backend_dtypes = {"inductor": ("float32",), "tvm": ("float32",)}

    def torch_fn(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        return x.double() + 1

    def flops(self, problem: Mapping[str, int]) -> float:
        return float(problem["M"])


class Undeclared(Workload):
    """A Workload subclass that declares no kernel (no params of its own): it was called "a
    ABCMeta, not a kernel (a Workload subclass ...)"."""
