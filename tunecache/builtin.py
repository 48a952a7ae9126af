"""The built-in kernels' specs, registered on import of :mod:`tunecache`.

Their math lives in the tuner-side ``workloads`` package (``workloads/matmul/`` …), whose classes
take these specs. The run-time path never imports it: the sources hashed into a built-in key are
found next to this package's own files (so a user's own folder named ``workloads/`` can never
stand in for ours).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunecache.kernels import KernelSpec, register

_ROOT = Path(__file__).resolve().parent.parent  # where tunecache/ and workloads/ are installed
_CPU = ("float32",)
# Kernel code every built-in shares per backend (Triton's row tiles and the out= checks).
_SHARED = {"triton": ("workloads/triton_kit/launch.py",)}
_NORM = ("workloads/triton_kit/norm.py",)  # the norm kernels' tile loads and stores
_ALL = {"tvm": _CPU, "inductor": _CPU, "triton": ("float32", "float16", "bfloat16")}

# The Triton spaces' enumerated choices (``workloads.triton_kit.spaces`` prunes them per problem and
# device): a served config of a built-in kernel must be one of them.
_BLOCKS = (16, 32, 64, 128, 256)
TRITON_GEMM: dict[str, tuple[int, ...]] = {
    "BLOCK_M": _BLOCKS,
    "BLOCK_N": _BLOCKS,
    "BLOCK_K": _BLOCKS,
    "GROUP_M": (1, 4, 8),
    "SPLIT_K": (1, 2, 4, 8, 16),
    "num_warps": (2, 4, 8),
    "num_stages": (2, 3, 4, 5),
}
TRITON_GEMM_DEFAULTS = {"SPLIT_K": 1}  # records tuned before split-K existed
TRITON_ROWS: dict[str, tuple[int, ...]] = {
    "BLOCK_N": tuple(2**i for i in range(4, 17)),  # 16 … 65536
    "ROWS_PER_PROGRAM": (1, 2, 4),
    "num_warps": (1, 2, 4, 8, 16),
    "num_stages": (1, 2, 3),
}
_GEMM: dict[str, Any] = {
    "choices": {"triton": TRITON_GEMM}, "config_defaults": {"triton": TRITON_GEMM_DEFAULTS},
}  # fmt: skip
_ROWS: dict[str, Any] = {"choices": {"triton": TRITON_ROWS}}


def _sources(name: str, **shared: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """A package's ``__init__.py`` for every backend, its ``<backend>.py`` for each, plus
    ``shared`` files (relative to the install root) per backend."""
    package = _ROOT / "workloads" / name
    sources: dict[str, tuple[str, ...]] = {"*": (str(package / "__init__.py"),)}
    for backend in _ALL:
        files = (*_SHARED.get(backend, ()), *shared.get(backend, ()))
        extra = tuple(str(_ROOT / f) for f in files)
        sources[backend] = (str(package / f"{backend}.py"), *extra)
    return sources


ROWS = (("M", "N"),)
MATMUL = register(KernelSpec(
    name="matmul", params=("M", "N", "K"), inputs=(("M", "K"), ("K", "N")), output=("M", "N"),
    bucket=("M",), dtypes=_ALL, sources=_sources("matmul"),
    description="C = A @ B (A: M×K, B: K×N)", **_GEMM,
))  # fmt: skip
SOFTMAX = register(KernelSpec(
    name="softmax", params=("M", "N"), inputs=ROWS, output=("M", "N"), bucket=("M",),
    dtypes=_ALL, sources=_sources("softmax"), description="Y = softmax(X, dim=-1) (X: M×N)",
    **_ROWS,
))  # fmt: skip
LAYERNORM = register(KernelSpec(
    name="layernorm", params=("M", "N"), inputs=(*ROWS, ("N",), ("N",)), output=("M", "N"),
    bucket=("M",), dtypes=_ALL, sources=_sources("layernorm", triton=_NORM),
    description="Y = layer_norm(X, (N,), weight, bias, eps=1e-5) (X: M×N)", **_ROWS,
))  # fmt: skip
RMSNORM = register(KernelSpec(
    name="rmsnorm", params=("M", "N"), inputs=(*ROWS, ("N",)), output=("M", "N"),
    bucket=("M",), dtypes=_ALL, sources=_sources("rmsnorm", triton=_NORM),
    description="Y = X / sqrt(mean(X², -1) + 1e-6) · weight (X: M×N, weight: N)", **_ROWS,
))  # fmt: skip
BIAS_GELU = register(KernelSpec(
    name="bias_gelu", params=("M", "N", "K"), inputs=(("M", "K"), ("K", "N"), ("N",)),
    output=("M", "N"), bucket=("M",), dtypes=_ALL,
    # The GEMM kernel with a fused epilogue lives in matmul's Triton module.
    sources=_sources("bias_gelu", triton=("workloads/matmul/triton.py",)),
    description="Y = gelu(X @ W + b) (X: M×K, W: K×N, b: N; exact erf GELU)", **_GEMM,
))  # fmt: skip
BUILTIN = (MATMUL, SOFTMAX, LAYERNORM, RMSNORM, BIAS_GELU)
