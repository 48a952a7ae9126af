"""Which machines may share Inductor's autotune choices: the partition string.

Inductor keys its local choice file by its "system" (``CacheBase.get_system()``: the GPU's name
and the CUDA/HIP and Triton versions, hashed). A choice timed on one system says nothing about
another, and a torch upgrade may change the choices themselves, so the team cache partitions
entries by both. Without a GPU Inductor's system hash is the same on every machine, so the CPU's
model and ISA level (:func:`tunecache.device.cpu_fingerprint`) are added.
"""

from __future__ import annotations

from typing import Any

MAX_PARTITION = 256  # the server's limit on a partition string


def inductor_system() -> dict[str, Any]:
    """Inductor's description of this machine (``{"hash": ..., "device": ..., "version": ...}``)."""
    from torch._inductor.codecache import CacheBase

    system = CacheBase.get_system()
    return dict(system) if isinstance(system, dict) else {"hash": str(system)}


def partition() -> str:
    """``"<system hash>|torch-<version>"`` (plus ``|<cpu arch>-<cpu name>`` without a GPU).

    Example:
        >>> partition()  # doctest: +SKIP
        '44136fa3...|torch-2.13.0+cpu|cpu-avx512-epyc'
    """
    import torch

    from tunecache.device import cpu_fingerprint

    system = inductor_system()
    parts = [str(system.get("hash", "unknown")), f"torch-{torch.__version__}"]
    device = system.get("device")
    if not (isinstance(device, dict) and device.get("name")):
        cpu = cpu_fingerprint()
        parts.append(f"{cpu.arch}-{cpu.name}")
    text = "|".join(parts)
    return "".join(ch if ch.isprintable() else "?" for ch in text)[:MAX_PARTITION]
