"""What a GPU allows one Triton program (a CUDA block): the numbers configs are pruned against.

Example:
    >>> from types import SimpleNamespace
    >>> props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", multi_processor_count=132,
    ...                         shared_memory_per_block_optin=232448, max_threads_per_block=1024)
    >>> DeviceLimits.from_properties(props).max_shared_memory_per_block
    232448
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

logger = logging.getLogger(__name__)

# CUDA's shared memory per block without the opt-in attribute, and its thread limit since Fermi.
DEFAULT_SHARED_MEMORY = 48 * 1024
DEFAULT_MAX_THREADS = 1024


@dataclass(frozen=True)
class DeviceLimits:
    """Per-block limits of one GPU model.

    Attributes:
        name: the device name (``NVIDIA H100 80GB HBM3``) or a preset's label.
        max_shared_memory_per_block: bytes one block may use after opting in
            (``cudaDevAttrMaxSharedMemoryPerBlockOptin``; Triton opts in for every kernel).
        max_threads_per_block: threads one block may have.
        sm_count: streaming multiprocessors (for grid-size heuristics).
        warp_size: threads per warp.
    """

    name: str
    max_shared_memory_per_block: int
    max_threads_per_block: int
    sm_count: int
    warp_size: int = 32

    H100: ClassVar[DeviceLimits]
    A100: ClassVar[DeviceLimits]
    CPU_INTERPRETER: ClassVar[DeviceLimits]

    def __post_init__(self) -> None:
        for field in ("max_shared_memory_per_block", "max_threads_per_block", "sm_count"):
            if getattr(self, field) <= 0:
                raise ValueError(
                    f"DeviceLimits.{field} must be positive, got {getattr(self, field)}"
                )
        if self.warp_size not in (32, 64):
            raise ValueError(f"DeviceLimits.warp_size must be 32 or 64, got {self.warp_size}")

    @classmethod
    def from_properties(cls, props: Any) -> DeviceLimits:
        """Limits from a ``torch.cuda.get_device_properties`` result (or any look-alike).

        ``shared_memory_per_block_optin`` is read when the torch build exposes it, else
        ``shared_memory_per_block`` (the 48 KiB default); ``max_threads_per_block`` and
        ``warp_size`` fall back to 1024 and 32.
        """
        optin = getattr(props, "shared_memory_per_block_optin", None)
        if not optin:
            optin = getattr(props, "shared_memory_per_block", None) or DEFAULT_SHARED_MEMORY
            logger.debug("%s: no opt-in shared memory limit; using %d bytes", props.name, optin)
        return cls(
            name=str(props.name),
            max_shared_memory_per_block=int(optin),
            max_threads_per_block=int(getattr(props, "max_threads_per_block", DEFAULT_MAX_THREADS)),
            sm_count=int(props.multi_processor_count),
            warp_size=int(getattr(props, "warp_size", 32) or 32),
        )

    @classmethod
    def from_torch_cuda(cls, index: int = 0) -> DeviceLimits:
        """Limits of CUDA device ``index`` (needs a CUDA build of torch and a visible GPU)."""
        import torch

        return cls.from_properties(torch.cuda.get_device_properties(index))


DeviceLimits.H100 = DeviceLimits("H100 (preset)", 232448, 1024, 132)  # SXM: 227 KiB opt-in
DeviceLimits.A100 = DeviceLimits("A100 (preset)", 166912, 1024, 108)  # 163 KiB opt-in
# The interpreter has no limits of its own: prune as on an H100 so spaces look as on a GPU.
DeviceLimits.CPU_INTERPRETER = DeviceLimits("CPU interpreter (H100 limits)", 232448, 1024, 132)


H100 = DeviceLimits.H100
A100 = DeviceLimits.A100
CPU_INTERPRETER = DeviceLimits.CPU_INTERPRETER


def current_limits() -> DeviceLimits:
    """The limits of the current CUDA device, or the ``CPU_INTERPRETER`` preset without one."""
    import torch

    if torch.cuda.is_available():
        return DeviceLimits.from_torch_cuda(torch.cuda.current_device())
    return DeviceLimits.CPU_INTERPRETER
