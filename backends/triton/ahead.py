"""Compiling a workload's Triton kernels for a GPU in a process that has none (the compile farm).

A farm process runs the workload's own launch in :func:`compile_only` mode, so each kernel it
launches (its own, or a library's plain ``@triton.jit`` kernel: vLLM's) compiles through
``JITFunction.run`` exactly as a launch would (same specialisation, same options, same cache key)
for the target a :class:`TargetDriver` reports instead of a real device's, and nothing launches.
The compiled kernel lands in Triton's cache directory (shared by every process of the machine:
``TRITON_CACHE_DIR`` or ``~/.triton/cache``), where the timing process's first launch of the same
config finds it: a cache hit, no compile. Triton's compile
listener counts what a process really compiled (:func:`compiles`), so that can be checked.

Tested with Triton 3.6 and 3.9 (``JITFunction.run(…, warmup=True)``,
``triton.runtime.driver.set_active``, ``knobs.compilation.listener``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from workloads.triton_kit.jit import compile_only

if TYPE_CHECKING:
    from backends.base import Target
    from tunecache.space import Config
    from workloads.base import Workload

_lock = threading.Lock()
_counts = {"compiled": 0, "cache_hits": 0}
_listening = False


class TargetDriver:
    """The active Triton driver of a process that compiles for ``target`` and never launches.

    ``JITFunction.run`` asks the driver for the current device, stream and target only; each
    target is a device of its own, so kernels compiled for one are never reused for another.
    """

    _devices: dict[tuple[str, int, int], int] = {}

    def __init__(self, backend: str, arch: int, warp_size: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget(backend, arch, warp_size)
        key = (backend, arch, warp_size)
        self.device = self._devices.setdefault(key, 1000 + len(self._devices))

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> int:
        return self.device

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def __repr__(self) -> str:
        return f"TargetDriver({self.target})"


def gpu_target(target: Target) -> tuple[str, int, int]:
    """``("cuda", 90, 32)`` for ``sm_90``: Triton's ``GPUTarget`` fields.

    Raises:
        ValueError: the target is not a CUDA ``sm_NN`` architecture.
    """
    arch = target.arch.removeprefix("sm_")
    if target.kind != "cuda" or not arch.isdigit():
        raise ValueError(f"cannot compile Triton kernels ahead for {target.kind} {target.arch}")
    return ("cuda", int(arch), target.limits.warp_size)


def compile_for(
    workload: Workload, problem: Mapping[str, int], dtype: str, config: Config, target: Target
) -> dict[str, int]:
    """Compiles ``workload``'s kernels for ``config`` at ``problem`` for ``target`` (no GPU
    needed); returns ``{"kernels": n, "shared": bytes}``, the largest shared memory a kernel of
    the launch uses.

    Inputs are allocated, never written or read: only their shapes, dtypes and alignment enter
    the kernels' specialisation, as in a launch on the device.
    """
    import torch
    import triton

    from workloads.base import torch_dtype

    count_compiles()
    driver = TargetDriver(*gpu_target(target))
    triton.runtime.driver.set_active(driver)
    inputs = [torch.empty(s, dtype=torch_dtype(dtype)) for s in workload.input_shapes(problem)]
    with compile_only() as kernels:
        workload.triton_launch(config, *inputs)
    shared = max((int(k.metadata.shared) for k in kernels), default=0)
    return {"kernels": len(kernels), "shared": shared}


def count_compiles() -> None:
    """Makes Triton report each compile and cache hit of this process (idempotent); an existing
    listener is kept and still called."""
    global _listening
    with _lock:
        if _listening:
            return
        from triton import knobs

        previous = knobs.compilation.listener

        def listen(*, src: Any, metadata: Any, metadata_group: Any, times: Any,
                   cache_hit: bool) -> None:  # fmt: skip
            _counts["cache_hits" if cache_hit else "compiled"] += 1
            if previous is not None:
                previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                         cache_hit=cache_hit)  # fmt: skip

        knobs.compilation.listener = listen
        _listening = True


def compiles() -> dict[str, int]:
    """``{"compiled": n, "cache_hits": m}`` since :func:`count_compiles` in this process."""
    return dict(_counts)
