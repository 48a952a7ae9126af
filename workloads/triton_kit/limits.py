"""What a GPU allows one Triton program (a CUDA block): the numbers configs are pruned against.

:class:`~tunecache.device.DeviceLimits` is part of a :class:`~tunecache.device.Device` (the
client checks a fetched config against it too); this module names the presets and the current
device's limits for the Triton backend.

Example:
    >>> H100.max_shared_memory_per_block
    232448
"""

from __future__ import annotations

from tunecache.device import DeviceLimits, local_device

H100 = DeviceLimits.H100
A100 = DeviceLimits.A100
CPU_INTERPRETER = DeviceLimits.CPU_INTERPRETER


def current_limits() -> DeviceLimits:
    """The limits of CUDA device 0, or the ``CPU_INTERPRETER`` preset without one."""
    import torch

    if torch.cuda.is_available():
        limits = local_device("cuda").limits
        assert limits is not None
        return limits
    return DeviceLimits.CPU_INTERPRETER


__all__ = ["A100", "CPU_INTERPRETER", "H100", "DeviceLimits", "current_limits"]
