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

import math
import re
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
UPLOADERS_MARK = "uploader's"  # beside each such ratio where the whole sentence does not fit
# What tunecache.interleave.median_interval aims at (its CONFIDENCE); fewer rounds than
# FULL_CONFIDENCE_ROUNDS cannot reach it, and their interval is their whole range.
CONFIDENCE = 0.95
FULL_CONFIDENCE_ROUNDS = 6
MAX_DECIMALS = 4  # a ratio's decimals at most, however near 1 it is


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


def noise_reasons(timings: Iterable[tuple[str, TimingModel]], cuda: bool) -> list[str]:
    """Why the named timings (on a GPU if ``cuda``) are noisy, each reason once, as ``who:
    why``: what their measurer said (in their figures' words where they say it too), then what
    their figures say and it did not (:meth:`~tunecache.measured.TimingModel.figures_noise`: an
    uploader's ``noisy: false``, or its own figure in a reason, is not taken for them)."""
    reasons: list[str] = []
    for who, timing in timings:
        said = timing.conditions.noise if timing.conditions is not None else []
        # A reason its figures give too is said with their figures: a stated "spread 1%" hid
        # the 50% they showed (and a stated 1.5 cores reads 1.4 from the stored 1.45).
        figures = {_kind(why): why for why in timing.figures_noise(cuda)}
        shown = [figures.pop(_kind(why), why) for why in said] + list(figures.values())
        reasons += [f"{who}: {why}" for why in shown]
    return list(dict.fromkeys(reasons))


def _kind(reason: str) -> str:
    """A noise reason without its figures: ``other processes used # cores``."""
    return re.sub(r"[0-9.]+", "#", reason)


def rounds(baselines: Iterable[BaselineModel], name: str) -> int | None:
    """How many rounds the interleaved comparison with baseline ``name`` kept (``None``: none)."""
    b = find(baselines, name)
    return None if b is None or b.speedup is None else b.speedup.rounds


def coverage(count: int, confidence: float = CONFIDENCE) -> float:
    """How often the distribution-free interval of the median of ``count`` rounds holds the
    median (:func:`tunecache.interleave.median_interval`, computed as it is): at least
    ``confidence`` from :data:`FULL_CONFIDENCE_ROUNDS` rounds on; below, the whole range of the
    rounds, which holds it less often (93.8 % for 5, 87.5 % for 4). A label saying "95 %" of
    those would claim more than was measured."""
    tail, k, below = (1.0 - confidence) / 2, 1, 0.0
    while k < (count + 1) // 2:
        below += math.comb(count, k - 1) / 2**count
        if below + math.comb(count, k) / 2**count > tail:
            break
        k += 1
    return 1.0 - 2 * sum(math.comb(count, i) for i in range(k)) / 2**count


def interval_label(count: int) -> str:
    """What the interval of a comparison of ``count`` rounds is, truthfully: ``95 % interval``
    where it reaches that, else ``93.8 % interval (the whole range of 5 rounds)``."""
    if coverage(count) >= CONFIDENCE:
        return f"{100 * CONFIDENCE:g} % interval"
    return f"{100 * coverage(count):.1f} % interval (the whole range of {count} rounds)"


def decimals(*factors: float) -> int:
    """The decimals that show each of ``factors`` (ratios above 1 called faster or slower, and
    the bound of their interval nearest 1) as more than 1: 2, or up to :data:`MAX_DECIMALS` as
    many as that takes. A 1.004x speedup (1.001-1.007x) read "1.00x faster (1.00-1.01x)":
    faster than itself, at the digits shown."""
    places = 2
    while places < MAX_DECIMALS and any(round(x, places) <= 1 for x in factors):
        places += 1
    return places
