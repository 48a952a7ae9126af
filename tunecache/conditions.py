"""The machine's conditions while something was timed, and whether they make the timing noisy.

A timing taken while other processes held the cores, the clock changed or the GPU throttled
reads the machine as much as the kernel. :func:`snapshot` reads what the operating system (and,
on a GPU, NVML where it is installed) says, before and after a measurement, :func:`between` the
two; :func:`noise` turns
that and the timing's own spread into the reasons it is noisy, if any. The tuner repeats a noisy
measurement (bounded) and, if it stays noisy, stores it flagged, with its conditions.

Read from ``/proc`` (Linux); elsewhere what cannot be read is ``None``, never a guess.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

NOISY_SPREAD = 0.10  # inter-quartile range over median past which a timing is noisy
NOISY_OTHERS = 0.5  # cores other processes used, on average, past which a CPU timing is noisy
NOISY_DISTURBED = 0.5  # share of samples disturbed (preempted) past which a timing is noisy
NOISY_CLOCK = 0.10  # relative clock change between before and after past which it is noisy
MIN_WALL_S = 0.05  # the shortest window other processes' CPU use is read over
# NVML throttle reasons that do not disturb a measurement: idle, the application clock setting.
_BENIGN_THROTTLE = {"gpu_idle", "applications_clocks_setting"}


@dataclass(frozen=True)
class Snapshot:
    """What the machine said at one moment."""

    wall_s: float
    busy_s: float | None  # CPU seconds all processes have used since boot (with steal)
    own_s: float  # CPU seconds this process has used
    clock_mhz: float | None  # the mean clock of the cores this process may run on
    gpu: GpuSnapshot | None = None


@dataclass(frozen=True)
class GpuSnapshot:
    sm_clock_mhz: float
    throttle: tuple[str, ...]  # NVML's active clock-event reasons, less the benign ones
    other_processes: int  # compute processes on the device besides this one


@dataclass(frozen=True)
class Reading:
    """The conditions over one measurement: from a snapshot before to one after."""

    others_cpu: float | None  # cores other processes used on average (None: not readable)
    clock_mhz: tuple[float, float] | None  # before, after
    gpu_clock_mhz: tuple[float, float] | None
    throttle: tuple[str, ...]
    gpu_others: int | None


def _clock_ticks() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return 100


def _busy_seconds() -> float | None:
    """CPU seconds spent busy since boot on the cores this process may run on (``/proc/stat``'s
    ``cpuN`` lines; steal counts: a hypervisor's other guests are other processes too). Load on
    cores this process cannot use (a fleet's compiles kept off reserved timing cores) is not
    counted."""
    cores = _cores()
    busy = 0
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                fields = line.split()
                if not fields or not fields[0].startswith("cpu") or fields[0] == "cpu":
                    continue
                if cores is not None and int(fields[0][3:]) not in cores:
                    continue
                user, nice, system, _idle, _iowait, irq, softirq, steal = (
                    int(v) for v in fields[1:9]
                )
                busy += user + nice + system + irq + softirq + steal
    except (OSError, ValueError):
        return None
    return busy / _clock_ticks()


def _own_seconds(family: bool = False) -> float:
    """CPU seconds this process has used; with ``family``, its children's too (those reaped and
    those alive: a compile pool is this process's own work, not another's)."""
    t = os.times()
    if not family:
        return t.user + t.system
    return t.user + t.system + t.children_user + t.children_system + _descendants_seconds()


def _descendants_seconds() -> float:
    """CPU seconds used by this process's living descendants (``/proc/PID/stat``; 0 elsewhere)."""
    parent: dict[int, int] = {}
    used: dict[int, float] = {}
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile, or unreadable
        with contextlib.suppress(ValueError, IndexError):
            # after the name: state ppid … utime stime cutime cstime (12th-15th), clock ticks
            parent[pid], used[pid] = int(fields[1]), sum(int(v) for v in fields[11:15])
    family = {os.getpid()}
    grew = True
    while grew:
        found = {pid for pid, ppid in parent.items() if ppid in family} - family
        family |= found
        grew = bool(found)
    family.discard(os.getpid())
    return sum(used[pid] for pid in family) / _clock_ticks()


def _cores() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _clock_mhz() -> float | None:
    """The mean current clock of this process's cores (cpufreq, else ``/proc/cpuinfo``)."""
    cores = _cores()
    found = []
    for core in sorted(cores or ()):
        try:
            with open(f"/sys/devices/system/cpu/cpu{core}/cpufreq/scaling_cur_freq",
                      encoding="ascii") as f:  # fmt: skip
                found.append(int(f.read()) / 1000)
        except (OSError, ValueError):
            break
    if found:
        return sum(found) / len(found)
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            mhz = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
    except (OSError, ValueError, IndexError):
        return None
    return sum(mhz) / len(mhz) if mhz else None


_THROTTLE_NAMES = {
    "gpu_idle": "nvmlClocksThrottleReasonGpuIdle",
    "applications_clocks_setting": "nvmlClocksThrottleReasonApplicationsClocksSetting",
    "sw_power_cap": "nvmlClocksThrottleReasonSwPowerCap",
    "hw_slowdown": "nvmlClocksThrottleReasonHwSlowdown",
    "sync_boost": "nvmlClocksThrottleReasonSyncBoost",
    "sw_thermal": "nvmlClocksThrottleReasonSwThermalSlowdown",
    "hw_thermal": "nvmlClocksThrottleReasonHwThermalSlowdown",
    "hw_power_brake": "nvmlClocksThrottleReasonHwPowerBrakeSlowdown",
}
THROTTLE_REASONS = tuple(_THROTTLE_NAMES)


def _gpu() -> GpuSnapshot | None:
    """The current CUDA device's SM clock, throttle reasons and other processes, through NVML
    (``pynvml``, where installed; ``None`` where it is not, or cannot name the device).

    The device is found by UUID (CUDA's and NVML's indices differ under
    ``CUDA_VISIBLE_DEVICES``). Other processes: the device's compute processes but one (this
    process has a context there: it just ran the kernel), which holds in a container too, where
    NVML's process ids are the host's. A query NVML does not support reads as nothing found.
    """
    try:
        import pynvml  # type: ignore[import-not-found, unused-ignore]
        import torch

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-")
                                                  else f"GPU-{uuid}")  # fmt: skip
        clock = float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except Exception:  # not installed, no driver, no such device
        return None
    active: tuple[str, ...] = ()
    with contextlib.suppress(Exception):
        mask = int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
        active = tuple(sorted(name for name, attr in _THROTTLE_NAMES.items()
                              if mask & int(getattr(pynvml, attr, 0))
                              and name not in _BENIGN_THROTTLE))  # fmt: skip
    others = 0
    with contextlib.suppress(Exception):
        others = max(0, len(pynvml.nvmlDeviceGetComputeRunningProcesses(handle)) - 1)
    return GpuSnapshot(clock, active, others)


def snapshot(cuda: bool = False, family: bool = False) -> Snapshot:
    """The machine now (on a GPU too with ``cuda``). With ``family``, this process's descendants
    count as its own (over a search that compiles in a pool of its own), not as others."""
    return Snapshot(time.perf_counter(), _busy_seconds(), _own_seconds(family), _clock_mhz(),
                    _gpu() if cuda else None)  # fmt: skip


def between(before: Snapshot, after: Snapshot) -> Reading:
    """The conditions from ``before`` to ``after``."""
    wall = after.wall_s - before.wall_s
    others = None  # over less than MIN_WALL_S, the kernel's 10 ms ticks would be most of it
    if before.busy_s is not None and after.busy_s is not None and wall >= MIN_WALL_S:
        own = after.own_s - before.own_s
        others = max(0.0, (after.busy_s - before.busy_s - own) / wall)
    clock = None
    if before.clock_mhz is not None and after.clock_mhz is not None:
        clock = (before.clock_mhz, after.clock_mhz)
    gpu_clock, gpu_others = None, None
    throttle: tuple[str, ...] = ()
    if before.gpu is not None and after.gpu is not None:
        gpu_clock = (before.gpu.sm_clock_mhz, after.gpu.sm_clock_mhz)
        throttle = tuple(sorted({*before.gpu.throttle, *after.gpu.throttle}))
        gpu_others = max(before.gpu.other_processes, after.gpu.other_processes)
    return Reading(others, clock, gpu_clock, throttle, gpu_others)


def _changed(pair: tuple[float, float] | None) -> bool:
    if pair is None or min(pair) <= 0:
        return False
    return abs(pair[1] - pair[0]) / min(pair) > NOISY_CLOCK


def noise(reading: Reading | None, *, spread: float, disturbed: float, cuda: bool) -> list[str]:
    """Why a timing is noisy (empty: it is not).

    Args:
        reading: the conditions over it (``None``: not read).
        spread: its inter-quartile range over its median.
        disturbed: the share of its samples disturbed (the process was preempted meanwhile).
        cuda: whether it was timed on a GPU (other processes' CPU use then does not count).

    Example:
        >>> r = Reading(1.9, (2600.0, 2600.0), None, (), None)
        >>> noise(r, spread=0.02, disturbed=0.1, cuda=False)
        ['other processes used 1.9 cores']
    """
    why = []
    if spread > NOISY_SPREAD:
        why.append(f"spread {spread:.0%} of the median")
    if disturbed > NOISY_DISTURBED:
        why.append(f"{disturbed:.0%} of samples disturbed")
    if reading is None:
        return why
    if not cuda and reading.others_cpu is not None and reading.others_cpu > NOISY_OTHERS:
        why.append(f"other processes used {reading.others_cpu:.1f} cores")
    if _changed(reading.clock_mhz) and not cuda:
        assert reading.clock_mhz is not None
        why.append(f"CPU clock {reading.clock_mhz[0]:.0f}->{reading.clock_mhz[1]:.0f} MHz")
    if _changed(reading.gpu_clock_mhz):
        assert reading.gpu_clock_mhz is not None
        before, after = reading.gpu_clock_mhz
        why.append(f"GPU clock {before:.0f}->{after:.0f} MHz")
    if reading.throttle:
        why.append("GPU throttled: " + ", ".join(reading.throttle))
    if reading.gpu_others:
        why.append(f"{reading.gpu_others} other processes on the GPU")
    return why
