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
import logging
import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tunecache.errors import InvalidInput

logger = logging.getLogger(__name__)


def host_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, not the machine's total)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


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
        for name in ("max_shared_memory_per_block", "max_threads_per_block", "sm_count"):
            if getattr(self, name) <= 0:
                raise ValueError(f"DeviceLimits.{name} must be positive, got {getattr(self, name)}")
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


DeviceLimits.H100 = DeviceLimits("H100 (preset)", 232448, 1024, 132)  # SXM: 227 KiB opt-in
DeviceLimits.A100 = DeviceLimits("A100 (preset)", 166912, 1024, 108)  # 163 KiB opt-in
# The interpreter has no limits of its own: prune as on an H100 so spaces look as on a GPU.
DeviceLimits.CPU_INTERPRETER = DeviceLimits("CPU interpreter (H100 limits)", 232448, 1024, 132)


@dataclass(frozen=True)
class Device:
    """A device a kernel runs on: its fingerprint (the key's device part) and the limits a config
    must fit.

    CUDA devices carry per-block :class:`DeviceLimits`; a CPU's limits are its cores and ISA
    flags, which the fingerprint already holds (``units``, ``flags``).

    Example:
        >>> from types import SimpleNamespace
        >>> h100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0,
        ...                        multi_processor_count=132, total_memory=80 * 2**30,
        ...                        shared_memory_per_block_optin=232448)
        >>> device = Device.from_cuda_properties(h100)
        >>> device.fingerprint.arch, device.limits.max_shared_memory_per_block
        ('sm_90', 232448)
    """

    fingerprint: DeviceFingerprint
    limits: DeviceLimits | None = None

    @property
    def kind(self) -> str:
        return self.fingerprint.kind

    @classmethod
    def from_cuda_properties(cls, props: Any) -> Device:
        """A CUDA device from ``torch.cuda.get_device_properties``'s result (or a look-alike)."""
        return cls(cuda_fingerprint_from_properties(props), DeviceLimits.from_properties(props))


DEVICE_KINDS = ("cpu", "cuda")

# The archs a target named by hand (a manifest's ``arch``) may be: NVIDIA's compute capabilities,
# and what :func:`cpu_fingerprint` says.
CUDA_ARCHS = (
    "sm_50", "sm_52", "sm_53", "sm_60", "sm_61", "sm_62", "sm_70", "sm_72", "sm_75", "sm_80",
    "sm_86", "sm_87", "sm_88", "sm_89", "sm_90", "sm_100", "sm_101", "sm_103", "sm_110",
    "sm_120", "sm_121",
)  # fmt: skip
CPU_ARCHS = (
    "cpu-avx512", "cpu-avx2", "cpu-sve", "cpu-neon", "cpu-x86_64", "cpu-aarch64", "cpu-arm64",
    "cpu-ppc64le", "cpu-s390x", "cpu-riscv64", "cpu-generic",
)  # fmt: skip


def check_arch(arch: object) -> str:
    """``arch`` when it is one a device can have (or this machine's CPU's own), for a target
    named by hand (a manifest's ``arch``).

    Raises:
        InvalidInput: not a string, or no device has it — listing those that do.
    """
    if isinstance(arch, str) and (arch in CUDA_ARCHS or arch in CPU_ARCHS):
        return arch
    if isinstance(arch, str) and arch == cpu_fingerprint().arch:  # an unusual CPU's own name
        return arch
    raise InvalidInput(f"arch {arch!r} is not a known arch; known: {', '.join(CUDA_ARCHS)}, "
                       f"{', '.join(CPU_ARCHS)}")  # fmt: skip


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


@functools.cache
def local_device(kind: str = "cpu") -> Device:
    """This process's device of ``kind`` (``cpu`` or ``cuda``: CUDA device 0), read once.

    Raises:
        InvalidInput: an unknown kind, or ``cuda`` on a machine with no visible CUDA device.
    """
    if kind == "cpu":
        return Device(cpu_fingerprint())
    if kind != "cuda":
        raise InvalidInput(f"unknown device kind {kind!r}; expected one of {DEVICE_KINDS}")
    try:
        import torch

        available = torch.cuda.is_available()
    except ImportError:
        available = False
    if not available:
        raise InvalidInput(
            "no CUDA device is visible here: a CUDA key names its GPU, so pass "
            "device=Device.from_cuda_properties(props) to build one for another machine"
        )
    return Device.from_cuda_properties(torch.cuda.get_device_properties(0))


def local_fingerprint(kind: str = "cpu") -> DeviceFingerprint:
    """The fingerprint of :func:`local_device` ``(kind)``."""
    return local_device(kind).fingerprint
