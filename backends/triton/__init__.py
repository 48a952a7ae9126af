"""The Triton backend: hand-written Triton kernels, tuned over pruned config spaces.

Importing this package imports neither Triton nor torch; kernels are jitted on first launch
(:mod:`workloads.triton_kit.jit`), in the CPU interpreter when ``TRITON_INTERPRET=1``
(:mod:`backends.triton.settings`).
"""

from __future__ import annotations

from backends.triton.backend import TritonBackend, TritonRunnable
from workloads.triton_kit.limits import DeviceLimits

__all__ = ["DeviceLimits", "TritonBackend", "TritonRunnable"]
