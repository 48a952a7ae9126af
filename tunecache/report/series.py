"""The numbers behind the speedup and convergence figures, as pure functions of records.

Speedups come from each winner's own ``baselines`` (the tuner timed them beside the winner, in
alternating rounds), with their intervals; a missing baseline stays ``None`` — it is never
estimated. A verifier re-times a winner, never its baselines: once its time is the one the
server ranks by, the speedups are still the uploader's, and a row says so (``retimed``) as
``tunecache get`` and the dashboard do. Convergence is the best time found so far
after each trial of the search, relative to the best the search found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tunecache import believed
from tunecache.report.labels import key_label, natural, several_archs
from tunecache.schemas import RecordPublic
from tunecache.timing import best_so_far
from tunecache.trialcount import default_last

DEFAULT = "default_config"  # the backend's config untuned
EAGER = "torch_eager"  # the same computation in eager PyTorch
MAX_CONVERGENCE_KEYS = 12  # searches drawn; more would not be readable


Interval = tuple[float, float]


@dataclass(frozen=True)
class Speedup:
    """One key's winner against its baselines: baseline time / winner time, the median of the
    interleaved comparison's rounds (``None``: the record has no such baseline), its
    distribution-free interval (``None``: a record without one) and the rounds it is of
    (:func:`tunecache.believed.interval_label`: fewer than 6 give less than 95 %), whether the
    record's timings were noisy, whether Triton's interpreter timed it on the host (its
    speedups say nothing of a GPU), the record's status on the server (``pending``: only its
    uploader validated it), and whether a verifier's time is the one it is ranked by
    (``retimed``: these ratios are then the uploader's, over the uploader's own time)."""

    label: str
    vs_default: float | None
    vs_eager: float | None
    default_interval: Interval | None = None
    eager_interval: Interval | None = None
    noisy: bool = False
    interpreted: bool = False
    status: str = "verified"
    retimed: bool = False
    default_rounds: int | None = None
    eager_rounds: int | None = None
    uploader: str = ""  # the token that uploaded it, as the server names it

    @property
    def status_mark(self) -> str:
        """`` (pending)`` (or the record's other status) for a record no verifier vouches for,
        for the key's label; nothing for a verified one."""
        return "" if self.status == "verified" else f" ({self.status})"

    @property
    def caveat(self) -> str:
        """What to know of these speedups, for the key's label: `` (interpreter)``, ``
        (noisy)`` or nothing, then `` (speedups: uploader's)`` where a verifier re-timed it."""
        timing = " (interpreter)" if self.interpreted else " (noisy)" if self.noisy else ""
        return timing + (f" (speedups: {believed.UPLOADERS_MARK})" if self.retimed else "")


@dataclass(frozen=True)
class Convergence:
    """One search: after trial ``trials[i]`` (1-based, failed ones counted), the best time so far
    was ``relative[i]`` times the best the search found; failed trials add no point."""

    label: str
    trials: tuple[int, ...]
    relative: tuple[float, ...]
    failed: int


def speedups(winners: Sequence[RecordPublic]) -> list[Speedup]:
    """The speedup of each winner over the default config and over torch eager, in label order
    (numbers read as numbers).

    Example:
        >>> [(s.label, s.vs_eager) for s in speedups([record])]  # doctest: +SKIP
        [('matmul tvm float32 M=64,N=64,K=64', 2.0)]
    """
    with_arch = several_archs([w.key for w in winners])
    rows = [
        Speedup(
            key_label(w.key, with_arch=with_arch),
            w.speedup(DEFAULT),
            w.speedup(EAGER),
            w.speedup_interval(DEFAULT),
            w.speedup_interval(EAGER),
            w.noisy,
            w.believed_timing.interpreted,
            w.status,
            retimed=w.timed()[0] == "verifier" and bool(w.comparisons()),
            default_rounds=believed.rounds(w.comparisons(), DEFAULT),
            eager_rounds=believed.rounds(w.comparisons(), EAGER),
            uploader=w.uploaded_by or "",
        )
        for w in winners
    ]
    return sorted(rows, key=lambda row: natural(row.label))


def convergence(record: RecordPublic, label: str) -> Convergence | None:
    """Best-so-far time relative to the final best after each successful trial of ``record``'s
    search; ``None`` when it holds no successful trial (a snapshot import keeps none). The
    default config timed beside the winner, last of the trials (:func:`default_last`), is not
    the search's: it counted as one more trial, and where it was the fastest the search's best
    read as its slower point."""
    searched = record.trials
    if searched and default_last(record, searched[-1].config):
        searched = searched[:-1]
    measured = [t.time_ms if t.status == "ok" else None for t in searched]
    running = best_so_far(measured)
    trials = [n for n, ms in enumerate(measured, start=1) if ms is not None]
    times = [b for b, ms in zip(running, measured, strict=True) if ms is not None and b is not None]
    failed = len(measured) - len(trials)
    if not times:
        return None
    final = times[-1]
    return Convergence(label, tuple(trials), tuple(t / final for t in times), failed)
