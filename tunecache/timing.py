"""Timers: warm-up, then the median of many samples.

* CPU: ``perf_counter``; calls shorter than ``min_sample_s`` are batched (``number`` calls per
  sample, as ``timeit`` does) so the timer's own resolution and overhead stay out of the figure.
* CUDA: a pair of CUDA events around every call, the L2 cache flushed before each by zeroing a
  256 MB buffer (as Triton's ``do_bench`` does), one synchronisation at the end. The figure is the
  device's time: before each call the device also spins for longer than the host takes to
  prepare one, so a launch path slower than its kernel (a decode GEMM runs in 20 µs on an H200,
  a Python launch can take 30 µs) never shows between the events. The host's time per call is a
  property of the launch path, not of the config (bench/gpu/launch_gap.py measures it).

With ``cutoff_ms`` set (the tuner sets it to 3× the best time so far), a call already slower
than that after the warm-up is not timed at length: its first estimate is its time.

Each timing holds its device's turn (:mod:`tunecache.devicelock`): two processes timing on one
GPU or on the same cores take turns. No search here. torch is imported only by the CUDA timer.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from tunecache import affinity, believed, conditions, devicelock
from tunecache.schemas import (
    MAX_NOISE_REASONS,
    SAME_BELOW,
    ConditionsModel,
    RecordCreate,
    TimingModel,
)

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

DISTURBED_BUDGET = 3  # times target_s a CPU timing may take to gather undisturbed samples
MIN_CLEAN = 5  # undisturbed samples that are enough to leave the disturbed ones out
LONG_CALL_S = 5e-3  # calls this long are timed within target_s even when disturbed


@dataclass(frozen=True)
class TimerSettings:
    """How long and how often to time one callable."""

    warmup: int = 3
    min_repeats: int = 15
    max_repeats: int = 200
    min_sample_s: float = 1e-3  # one sample lasts at least this long (batching fast calls)
    target_s: float = 0.3  # stop adding repeats once this much time was spent
    cutoff_ms: float | None = None  # a call slower than this is cut short (see the module)


DEFAULT_TIMER = TimerSettings()


def _switches() -> int:
    """How often this process has been preempted (involuntary context switches, all threads)."""
    if resource is None:  # not on this platform: no sample is known to be disturbed
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


def time_cpu(fn: Callable[[], Any], settings: TimerSettings = DEFAULT_TIMER) -> TimingModel:
    """Times ``fn()``: median per-call milliseconds with min, max and inter-quartile range.

    A sample during which the process was preempted (another process took its core) is left
    out: load only ever adds time; while most are, samples are made shorter (fewer calls each),
    to fit between the other processes' turns. Samples are added until ``min_repeats``
    undisturbed ones were taken or ``DISTURBED_BUDGET`` times ``target_s`` was spent; with too
    few undisturbed ones, the quickest quarter of all counts (the least disturbed), and the
    timing says how many were disturbed (:mod:`tunecache.conditions`).
    """
    with devicelock.timing_on("cpu") as turn:  # its cores' turn (other processes' timings)
        for _ in range(settings.warmup):
            fn()
        before = conditions.snapshot()  # after the warm-up: the clock has ramped up by now
        with affinity.apart():  # its threads kept apart (the warm-up has started its pools)
            sampled = _sample(fn, settings)
        return _stats(sampled.samples, settings, sampled.repeats, sampled.timer, before,
                      left_out=sampled.left_out, disturbed=sampled.disturbed,
                      turn=turn)  # fmt: skip


@dataclass(frozen=True)
class _Sampled:
    samples: list[float]  # ms per call
    repeats: int
    timer: str
    left_out: int = 0
    disturbed: float = 0.0


def _sample(fn: Callable[[], Any], settings: TimerSettings) -> _Sampled:
    """:func:`time_cpu`'s samples, after its warm-up."""
    start = time.perf_counter()
    fn()
    single = max(time.perf_counter() - start, 1e-9)
    if settings.cutoff_ms is not None and single * 1e3 > settings.cutoff_ms:
        return _Sampled([single * 1e3], 1, f"perf_counter, cut short: over "
                        f"{settings.cutoff_ms:.4g} ms")  # fmt: skip
    number = max(1, int(settings.min_sample_s / single))
    # A call that spans scheduler ticks (LONG_CALL_S) is rarely undisturbed, and a tick is a
    # small part of it: longer sampling would buy little.
    budget = DISTURBED_BUDGET if single < LONG_CALL_S else 1
    clean: list[tuple[float, int]] = []  # (ms per call, calls)
    disturbed: list[tuple[float, int]] = []
    spent = 0.0

    def more() -> bool:
        taken = len(clean) + len(disturbed)
        if taken >= 2 * settings.max_repeats or len(clean) >= settings.max_repeats:
            return False
        if taken < settings.min_repeats:
            return True
        if len(clean) < settings.min_repeats:
            return spent < budget * settings.target_s
        return spent < settings.target_s

    while more():
        switches = _switches()
        start = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - start
        spent += elapsed
        (clean if _switches() == switches else disturbed).append((elapsed / number * 1e3, number))
        if number > 1 and len(disturbed) > max(2, len(clean)):
            # Most samples are preempted: shorter ones fit between the other processes' turns
            # (and the longer ones are dropped, so that one median has one sample length).
            number = max(1, number // 4)
            clean, disturbed = [], []
    taken = len(clean) + len(disturbed)
    if len(clean) >= MIN_CLEAN:
        used, how = clean, f"median of {len(clean)} samples"
    else:  # hardly one undisturbed: the quickest quarter is the least disturbed
        used = sorted(clean + disturbed)[: max(MIN_CLEAN, taken // 4)]
        how = f"quickest {len(used)} of {taken} samples"
    return _Sampled([ms for ms, _ in used], sum(calls for _, calls in used),
                    f"perf_counter {how} x {number} call{'s' if number != 1 else ''}",
                    left_out=taken - len(used),
                    disturbed=len(disturbed) / taken)  # fmt: skip


L2_FLUSH_BYTES = 256 * 2**20


def _stats(samples: list[float], settings: TimerSettings, repeats: int, timer: str,
           before: conditions.Snapshot, *, cuda: bool = False, left_out: int = 0,
           disturbed: float = 0.0, turn: devicelock.Turn) -> TimingModel:  # fmt: skip
    reading = conditions.between(before, conditions.snapshot(cuda))
    quartiles = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    median = statistics.median(samples)
    iqr = max(0.0, quartiles[2] - quartiles[0])
    noise = conditions.noise(reading, spread=iqr / median if median > 0 else 0.0,
                             disturbed=disturbed, cuda=cuda) + turn.noise  # fmt: skip
    return TimingModel(
        median_ms=median,
        min_ms=min(samples),
        max_ms=max(samples),
        iqr_ms=iqr,
        repeats=repeats,
        warmup=settings.warmup,
        timer=timer,
        noisy=bool(noise),
        conditions=conditions_model(reading, left_out=left_out, noise=noise),
    )


def conditions_model(reading: conditions.Reading, *, left_out: int = 0, attempts: int = 1,
                     noise: list[str]) -> ConditionsModel:  # fmt: skip
    """``reading`` as the schema stores it (rounded: MHz to 1, cores to 0.01)."""
    cpu = reading.clock_mhz or (None, None)
    gpu = reading.gpu_clock_mhz or (None, None)
    others = None if reading.others_cpu is None else round(reading.others_cpu, 2)
    return ConditionsModel(
        others_cpu=others,
        cpu_mhz_before=_mhz(cpu[0]), cpu_mhz_after=_mhz(cpu[1]),
        gpu_mhz_before=_mhz(gpu[0]), gpu_mhz_after=_mhz(gpu[1]),
        throttle=list(reading.throttle), gpu_others=reading.gpu_others,
        left_out=left_out, attempts=attempts, noise=noise[:MAX_NOISE_REASONS],
    )  # fmt: skip


def _mhz(value: float | None) -> float | None:
    return None if value is None else float(round(value))


HOST_MARGIN_MS = 0.05  # the spin's margin over twice the host's time per call


@functools.cache
def _spin_cycles_per_ms() -> float:
    """How many cycles of ``torch.cuda._sleep`` the current device spins per millisecond."""
    import torch

    torch.cuda._sleep(1000)  # loaded, and the clock up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(SPIN_PROBE_CYCLES)
    end.record()
    torch.cuda.synchronize()
    return SPIN_PROBE_CYCLES / max(start.elapsed_time(end), 1e-3)


SPIN_PROBE_CYCLES = 2_000_000  # about a millisecond at the clocks of current GPUs


def time_cuda(fn: Callable[[], Any], settings: TimerSettings = DEFAULT_TIMER) -> TimingModel:
    """Times ``fn()`` on the current CUDA device with events, flushing L2 before every call."""
    with devicelock.timing_on("cuda") as turn:  # the GPU's turn (other processes' timings)
        return _time_cuda(fn, settings, turn)


def _time_cuda(
    fn: Callable[[], Any], settings: TimerSettings, turn: devicelock.Turn
) -> TimingModel:
    import torch

    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    for _ in range(settings.warmup):
        fn()
    torch.cuda.synchronize()
    before = conditions.snapshot(cuda=True)  # after the warm-up: not the idle clock
    # Estimate one call (with its flush) to size the run to ``target_s``.
    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = time.perf_counter()
    first.record()
    for _ in range(5):
        flush.zero_()
        fn()
    last.record()
    host_ms = (time.perf_counter() - host) / 5 * 1e3  # the host's time per call, queued only
    torch.cuda.synchronize()
    estimate_s = max(first.elapsed_time(last) / 5 / 1e3, 1e-7)
    if settings.cutoff_ms is not None and estimate_s * 1e3 > settings.cutoff_ms:
        # the flush is inside the estimate: an upper bound, fine for a candidate this slow
        return _stats([estimate_s * 1e3], settings, 5, f"cuda events, cut short: over "
                      f"{settings.cutoff_ms:.4g} ms", before, cuda=True, turn=turn)  # fmt: skip
    # twice the host's time per call, and then some: the device stays behind the host
    sleep = getattr(torch.cuda, "_sleep", None)  # torch's own, private: absent, no spin
    spin_ms = 0.0 if sleep is None else 2 * host_ms + HOST_MARGIN_MS
    spin = int(spin_ms * _spin_cycles_per_ms()) if spin_ms else 0
    per_call_s = estimate_s + spin_ms / 1e3
    count = int(
        min(settings.max_repeats, max(settings.min_repeats, settings.target_s / per_call_s))
    )
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    for start, end in zip(starts, ends, strict=True):
        flush.zero_()
        if sleep is not None and spin:
            sleep(spin)
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    return _stats(samples, settings, count, f"cuda events, L2 flushed, median of {count}", before,
                  cuda=True, turn=turn)  # fmt: skip


ONE_ROUND: Final = f" ({believed.ONE_ROUND})"  # what a comparison of a single round says


def speedup_text(
    speedup: float, times: str = "x", interval: tuple[float, float] | None = None, than: str = ""
) -> str:
    """``2.00x faster``, ``1.89x slower`` or ``1.00x (the same)``: never a bare ``0.53x``, nor
    a ratio called faster or slower that reads 1.00 (``1.004x faster``: :func:`believed.decimals`).
    With the interval of an interleaved comparison, the interval too, and ``the same within
    noise`` when it holds 1, with the median (a median of 0.67x within 0.59-1.01x is no tie to
    hide).

    Args:
        speedup: baseline time / tuned time.
        times: the multiplication sign (``x`` on a terminal, ``×`` in HTML).
        interval: ``(low, high)`` of ``speedup`` (:class:`tunecache.schemas.Speedup`).
        than: the baseline's name, to say what it is faster or slower than.

    Example:
        >>> speedup_text(2.0), speedup_text(0.5, interval=(0.45, 0.55))
        ('2.00x faster', '2.00x slower (1.82-2.22x)')
        >>> speedup_text(1.02, interval=(0.97, 1.08), than="torch eager")
        'the same as torch eager within noise (median 1.02x, 0.97-1.08x)'
    """
    than_it = f" than {than}" if than else ""
    if interval is not None:
        low, high = interval
        if low <= 1.0 <= high:
            same = f"the same as {than}" if than else "the same"
            return f"{same} within noise (median {speedup:.2f}{times}, {low:.2f}-{high:.2f}{times})"
        if speedup >= 1:  # the digits that show it, and its bound nearest 1, above 1
            d = believed.decimals(speedup, low)
            return f"{speedup:.{d}f}{times} faster{than_it} ({low:.{d}f}-{high:.{d}f}{times})"
        factor, near, far = 1 / speedup, 1 / high, 1 / low
        d = believed.decimals(factor, near)
        return f"{factor:.{d}f}{times} slower{than_it} ({near:.{d}f}-{far:.{d}f}{times})"
    if SAME_BELOW <= speedup < 1 / SAME_BELOW:
        return f"1.00{times} (the same as {than})" if than else f"1.00{times} (the same)"
    factor = speedup if speedup >= 1 else 1 / speedup
    verdict = "faster" if speedup >= 1 else "slower"
    return f"{factor:.{believed.decimals(factor)}f}{times} {verdict}{than_it}"


def best_so_far(times: Sequence[float | None]) -> list[float | None]:
    """The fastest time among the trials up to each one (``None`` until one has run; a failed
    trial is ``None``)."""
    found: list[float | None] = []
    best: float | None = None
    for time_ms in times:
        if time_ms is not None and (best is None or time_ms < best):
            best = time_ms
        found.append(best)
    return found


def versus(record: RecordCreate, baseline: str = "torch_eager", times: str = "x",
           than: str = "", missing: str = "-") -> str:  # fmt: skip
    """The record's speedup over ``baseline`` as :func:`speedup_text` says it, with the
    interval of its interleaved comparison where it has one, and what it lacks in brackets
    (:func:`tunecache.believed.caveats`: no spread, or the uploader's measurement beside a
    verifier's time); ``missing`` without that baseline, or none believed.

    Example:
        >>> from tunecache.examples import RECORD
        >>> versus(RecordCreate.model_validate(RECORD), "default_config")
        '1.46x faster (medians timed apart, no spread)'
    """
    value = record.speedup(baseline)
    if value is None:
        return missing
    text = speedup_text(value, times, interval=record.speedup_interval(baseline), than=than)
    retimed = record.timed()[0] == "verifier"  # a bare ratio would read as certain
    return text + believed.caveats(record.comparisons(), record.timing, baseline, retimed)


def noise_text(record: RecordCreate) -> str:
    """``noisy: winner: other processes used 1.3 cores; ...``, or ``""`` for a quiet record."""
    reasons = record.noise()
    return "noisy: " + "; ".join(reasons) if reasons else ""


def conditions_text(conditions: ConditionsModel) -> str:
    """The machine's conditions over a timing in a line: ``other processes used 0.05 cores ·
    CPU 2596 MHz · 3 disturbed samples left out · timed twice``."""
    parts = []
    if conditions.others_cpu is not None:
        parts.append(f"other processes used {conditions.others_cpu:.2f} cores")
    for what, before, after in (
        ("CPU", conditions.cpu_mhz_before, conditions.cpu_mhz_after),
        ("GPU", conditions.gpu_mhz_before, conditions.gpu_mhz_after),
    ):
        if before is not None and after is not None:
            clock = f"{before:.0f}" if before == after else f"{before:.0f}->{after:.0f}"
            parts.append(f"{what} {clock} MHz")
    if conditions.throttle:
        parts.append("throttled: " + ", ".join(conditions.throttle))
    if conditions.gpu_others:
        others = conditions.gpu_others
        parts.append(f"{others} other process{'es' if others != 1 else ''} on the GPU")
    if conditions.left_out:
        out = conditions.left_out
        parts.append(f"{out} sample{'s' if out != 1 else ''} left out (disturbed)")
    if conditions.attempts > 1:
        parts.append(f"timed {conditions.attempts} times")
    return " · ".join(parts) or "not read"
