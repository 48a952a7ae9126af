"""What a record's display may claim of its measurements: which of its baselines' comparisons
stand beside the time it is ranked by, what each comparison lacks, and why the timings it shows
are noisy. :class:`tunecache.schemas.RecordCreate` and ``RecordPublic`` read them from here, and
every listing (``tunecache get``, ``records ls``/``show``, the dashboard) through those.

A verifier re-times a record's config, never its baselines: once its time is the one shown, a
speedup is still the uploader's measurement, and stands marked so. It is not believed at all
where the verifier flagged the uploaded time, or timed the record on the uploader's very device
and the two differ past :data:`APART_RATIO` either way (``RecordPublic.comparisons``): the
uploader's machine then measured something other than what the verifier saw.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from pydantic import ValidationInfo

from tunecache.measured import SAME_BELOW, BaselineModel, TimingModel
from tunecache.strict import SERVED, STORED

# The ratio of a verifier's median to its uploader's past which, either way, the uploader's
# comparisons are not believed; cache_server.trust flags an uploaded time this much faster than
# the verifier's (TIMING_FLAG_RATIO).
APART_RATIO = 1.25
APART = "medians timed apart, no spread"  # a ratio of two medians, not an interleaved comparison
ONE_ROUND = "one round: no spread"
UPLOADERS = "the uploader's measurements, not re-timed by the verifier"


def disagree(verifier: TimingModel, uploader: TimingModel) -> bool:
    """Whether a verifier's median and its uploader's differ by more than :data:`APART_RATIO`,
    in either direction (an uploader 13x slower than the verifier's time is no more believed
    than one 13x faster)."""
    ratio = verifier.median_ms / uploader.median_ms
    return not 1 / APART_RATIO <= ratio <= APART_RATIO


def named_once(baselines: Sequence[BaselineModel]) -> list[BaselineModel]:
    """``baselines`` less every one whose name is there twice (stored before uploads of such
    were refused): of two "torch_eager" rows, neither is believed."""
    counts = Counter(b.name for b in baselines)
    return [b for b in baselines if counts[b.name] == 1]


def one_of_each(value: list[BaselineModel], info: ValidationInfo) -> list[BaselineModel]:
    """A validator of an upload's ``baselines``: the list, if no name is there twice (a second
    "torch_eager" row showed a false 1000x beside the real one); one stored or served is read
    as it is (:func:`named_once` drops the twins from what is shown)."""
    twice = sorted(name for name, n in Counter(b.name for b in value).items() if n > 1)
    if twice and info.context is not STORED and info.context is not SERVED:
        raise ValueError(f"baselines name {twice} more than once; a record has one of each")
    return value


def find(baselines: Iterable[BaselineModel], name: str) -> BaselineModel | None:
    """The baseline called ``name`` (``None`` without one)."""
    return next((b for b in baselines if b.name == name), None)


def speedup(baselines: Iterable[BaselineModel], winner: TimingModel, name: str) -> float | None:
    """How many times faster than baseline ``name`` the winner ran: the interleaved comparison's
    median where there is one, else the baseline's median over ``winner``'s."""
    b = find(baselines, name)
    if b is None:
        return None
    return b.speedup.median if b.speedup is not None else b.timing.median_ms / winner.median_ms


def interval(baselines: Iterable[BaselineModel], name: str) -> tuple[float, float] | None:
    """The interval of :func:`speedup` from an interleaved comparison of more than one round."""
    b = find(baselines, name)
    if b is None or b.speedup is None or b.speedup.rounds <= 1:
        return None
    return b.speedup.low, b.speedup.high


def slower_than_eager(baselines: Sequence[BaselineModel], winner: TimingModel) -> bool:
    """Whether torch eager ran measurably faster than the winner: the whole interval below 1,
    else a ratio below :data:`SAME_BELOW`."""
    b = find(baselines, "torch_eager")
    if b is not None and b.speedup is not None and b.speedup.rounds > 1:
        return b.speedup.high < 1.0
    value = speedup(baselines, winner, "torch_eager")
    return value is not None and value < SAME_BELOW


def caveats(baselines: Iterable[BaselineModel], winner: TimingModel, name: str,
            retimed: bool) -> str:  # fmt: skip
    """What the comparison with baseline ``name`` lacks, in brackets (``""``: nothing): no
    spread (a ratio of medians timed apart, or a single round) and, once a verifier's time is
    the one shown (``retimed``), that the comparison is the uploader's. A baseline timed as the
    winner itself (the default config won) is the same measurement: no ratio to doubt."""
    b = find(baselines, name)
    if b is None:
        return ""
    notes = []
    if b.speedup is None and b.timing != winner:
        notes.append(APART)
    elif b.speedup is not None and b.speedup.rounds == 1:
        notes.append(ONE_ROUND)
    if retimed:
        notes.append(UPLOADERS)
    return f" ({'; '.join(notes)})" if notes else ""


def noise_reasons(timings: Iterable[tuple[str, TimingModel]]) -> list[str]:
    """Why the named timings are noisy, each reason once, as ``who: why``."""
    reasons: list[str] = []
    for who, timing in timings:
        if timing.conditions is not None:
            reasons += [f"{who}: {why}" for why in timing.conditions.noise]
    return list(dict.fromkeys(reasons))
