"""The device fingerprint: what a tuned config is only valid for.

A fingerprint names the architecture (``sm_90``, ``cpu-avx512``) and the device itself (normalised
name, SM or core count, memory). Marketing names are unstable (``NVIDIA H100 80GB HBM3`` vs
``H100_80GB_HBM3``), so the key holds a normalised name and the raw name travels as an alias.

Reading the fingerprint never imports torch on a CPU; the CUDA path uses torch only when asked.

Example:
    >>> info = "model name : Intel Xeon\\nflags : fpu avx avx2 fma\\n"
    >>> fp = cpu_fingerprint(cpuinfo=info, cores=2)
    >>> fp.arch, fp.name
    ('cpu-avx2', 'intel-xeon')
"""

from __future__ import annotations

import functools
import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# ISA flags that change which code a compiler emits, and so which config wins.
_X86_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
    "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
)  # fmt: skip
_ARM_FLAGS = ("asimd", "asimdhp", "sve", "sve2", "bf16", "i8mm")


def normalise_name(raw: str) -> str:
    """Lower-cased, vendor and punctuation dropped.

    ``NVIDIA H100 80GB HBM3`` → ``h100-80gb-hbm3``.
    """
    name = raw.lower()
    name = re.sub(r"\((r|tm)\)|\bcpu\b|@.*$", " ", name)
    name = re.sub(r"^\s*(nvidia|amd)\s+", "", name)
    name = re.sub(r"[^a-z0-9.]+", "-", name).strip("-")
    return name or "unknown"


@dataclass(frozen=True)
class DeviceFingerprint:
    """The device part of a cache key."""

    kind: str  # "cpu" | "cuda"
    arch: str  # "cpu-avx512", "sm_90", ...
    name: str  # normalised device name
    units: int  # CPU cores or CUDA SMs
    memory_gb: int = 0  # device memory, CUDA only
    flags: tuple[str, ...] = ()
    raw_name: str = field(default="", compare=False)

    def to_json(self) -> dict[str, Any]:
        """The fields that identify the device (the raw name is an alias, not identity)."""
        return {
            "kind": self.kind,
            "arch": self.arch,
            "name": self.name,
            "units": self.units,
            "memory_gb": self.memory_gb,
            "flags": list(self.flags),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeviceFingerprint:
        return cls(
            kind=data["kind"],
            arch=data["arch"],
            name=data["name"],
            units=int(data["units"]),
            memory_gb=int(data.get("memory_gb", 0)),
            flags=tuple(data.get("flags", ())),
        )


def _cpu_arch(flags: set[str], machine: str) -> str:
    if "avx512f" in flags:
        return "cpu-avx512"
    if "avx2" in flags:
        return "cpu-avx2"
    if "sve" in flags:
        return "cpu-sve"
    if "asimd" in flags:
        return "cpu-neon"
    return f"cpu-{machine or 'generic'}"


def cpu_fingerprint(*, cpuinfo: str | None = None, cores: int | None = None) -> DeviceFingerprint:
    """The fingerprint of this machine's CPU, from ``/proc/cpuinfo`` where there is one."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text(errors="replace") if path.exists() else ""
    model = ""
    present: set[str] = set()
    for line in cpuinfo.splitlines():
        head, _, value = line.partition(":")
        head = head.strip().lower()
        if head in ("model name", "hardware", "cpu model") and not model:
            model = value.strip()
        elif head in ("flags", "features") and not present:
            present = set(value.split())
    model = model or platform.processor() or platform.machine()
    wanted = _X86_FLAGS + _ARM_FLAGS
    flags = tuple(f for f in wanted if f in present)
    return DeviceFingerprint(
        kind="cpu",
        arch=_cpu_arch(present, platform.machine().lower()),
        name=normalise_name(model),
        units=cores if cores is not None else (os.cpu_count() or 1),
        flags=flags,
        raw_name=model,
    )


def cuda_fingerprint_from_properties(props: Any) -> DeviceFingerprint:
    """The fingerprint of a CUDA device from ``torch.cuda.get_device_properties``'s result."""
    return DeviceFingerprint(
        kind="cuda",
        arch=f"sm_{props.major}{props.minor}",
        name=normalise_name(props.name),
        units=int(props.multi_processor_count),
        memory_gb=round(props.total_memory / 2**30),
        raw_name=props.name,
    )


def cuda_fingerprint(index: int = 0) -> DeviceFingerprint:
    """The fingerprint of CUDA device ``index`` (imports torch)."""
    import torch

    return cuda_fingerprint_from_properties(torch.cuda.get_device_properties(index))


@functools.cache
def local_fingerprint(kind: str = "cpu") -> DeviceFingerprint:
    """This process's device of ``kind`` (``cpu`` or ``cuda``), read once per process."""
    if kind == "cpu":
        return cpu_fingerprint()
    if kind == "cuda":
        return cuda_fingerprint()
    raise ValueError(f"unknown device kind {kind!r}; expected 'cpu' or 'cuda'")
