"""Interleaved comparisons: contenders timed in alternating rounds in one window, so that what
the machine does meanwhile (other processes, clocks, a noisy neighbour) falls on all of them alike.

Two timings taken at different moments compare the moments as much as the configs: on a busy
2-core machine the same softmax timed 0.093 ms in one run and 10 ms in the next, and on an H100
4 of 36 winners re-timed slower than their own default config. Here every round times each
contender once, in an order that rotates from round to round (``A B C``, ``B C A``, ``C A B``,
…: no contender always runs first, after the others have warmed the caches). Load only ever
adds time, so a round much slower than the quickest was disturbed and is left out (a burst that
fell on one contender of it would read as a difference); a ratio is the median of the per-round
ratios of the rest, and its interval the distribution-free one for a median.

Pure functions of the times: the timing itself is the caller's (:mod:`tunecache.timing`).

Example:
    >>> times = [[1.0, 2.0], [1.1, 2.1], [5.0, 10.0], [0.9, 2.0], [1.0, 1.9]]
    >>> len(quiet(times))  # the third round was disturbed
    4
    >>> r = ratio(times, 1, 0)
    >>> round(r.median, 2), r.verdict()
    (1.95, 'slower')
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from tunecache.timing import ONE_ROUND, speedup_text

ROUNDS = 5  # rounds of a tune's final comparison (tuner.select), and of each added batch
MAX_ROUNDS = 15  # rounds it may grow to while the comparison is undecided
MIN_ROUNDS = 3  # the fewest a time budget reserves for: fewer give no interval worth the name
# What an interval aims at: reached from 6 rounds on; below, the whole range of the rounds holds
# the median less often (tunecache.believed.interval_label names what each count reaches).
CONFIDENCE = 0.95
DISTURBED = 1.25  # a round that took longer than this times the quickest one was disturbed
# How far apart identical timings land in one window anyway: a ratio's interval reaches at least
# this far either side of its median. On a 2-core EPYC, one Inductor config built twice and timed
# in the same alternating rounds read 0.991 (0.988-0.998): an interval of the rounds alone
# excluded 1 for a config against itself (bench/results/timing_noise-epyc.md, run 5).
REPRODUCIBLE = 0.01
Verdict = Literal["faster", "slower", "same"]


def rounds(
    time_one: Callable[[int], float], contenders: int, count: int, first: int = 0
) -> list[list[float]]:
    """``count`` rounds of ``time_one(i)`` for every contender ``i``: ``result[r][i]``, round
    ``r`` starting with contender ``(first + r) % contenders`` (``first``: the rounds already
    run, when adding more)."""
    if contenders < 1 or count < 1:
        raise ValueError(f"need contenders and rounds, got {contenders} and {count}")
    result = []
    for r in range(first, first + count):
        row = [0.0] * contenders
        for step in range(contenders):
            i = (r + step) % contenders
            row[i] = time_one(i)
        result.append(row)
    return result


def quiet(times: Sequence[Sequence[float]]) -> list[Sequence[float]]:
    """The rounds that took at most ``DISTURBED`` times as long as the quickest round: load on
    the machine only ever adds time, and a round it fell on partly (one contender slowed, not the
    other) would read as a difference between them. A round where a contender failed (a time of
    0 or less) is not one of them, nor is it the quickest."""
    return [times[r] for r in quiet_rounds(times)]


def quiet_rounds(times: Sequence[Sequence[float]]) -> list[int]:
    """The indices of the :func:`quiet` rounds, in order."""
    timed = [r for r, row in enumerate(times) if all(t > 0 for t in row)]
    totals = {r: sum(times[r]) for r in timed}
    if not totals:
        return []
    quickest = min(totals.values())
    return [r for r in timed if totals[r] <= DISTURBED * quickest]


def _per_round(times: Sequence[Sequence[float]], i: int, j: int) -> list[float]:
    timed = [row for row in times if row[i] > 0 and row[j] > 0]
    per_round = [row[i] / row[j] for row in quiet(timed)]
    if not per_round:
        raise ValueError("no round timed both contenders")
    return per_round


def median_ratio(times: Sequence[Sequence[float]], i: int, j: int) -> float:
    """Contender ``i``'s time over contender ``j``'s: the median of the per-round ratios
    (below 1: ``i`` is faster)."""
    return statistics.median(_per_round(times, i, j))


@dataclass(frozen=True)
class Ratio:
    """Time of one contender over another's: the median of per-round ratios and its
    distribution-free interval (:func:`median_interval`). Above 1: the first is slower."""

    median: float
    low: float
    high: float
    rounds: int

    def verdict(self) -> Verdict:
        """``faster`` or ``slower`` when the whole interval is on one side of 1, else ``same``
        (the same within noise)."""
        if self.high < 1.0:
            return "faster"
        if self.low > 1.0:
            return "slower"
        return "same"


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The distribution-free interval for the median of what ``values`` were drawn from: the
    ``k``-th smallest to the ``k``-th largest, ``k`` the largest with
    ``P(Binomial(n, 1/2) < k) ≤ (1 − confidence) / 2`` (each value falls below the median with
    probability 1/2, whatever the distribution).

    Rounds are few (5 to 15), and a bootstrap of the median over so few values is too narrow:
    it held the median of a skewed distribution in 90-91 % of draws of 9 and 15. Below 6
    values no ``k`` reaches 95 %: the interval is the whole range (93.8 % for 5, 87.5 % for 4).
    """
    ordered = sorted(values)
    n = len(ordered)
    tail, k, below = (1.0 - confidence) / 2, 1, 0.0  # below: P(Binomial(n, 1/2) < k)
    while k < (n + 1) // 2:
        below += math.comb(n, k - 1) / 2**n
        if below + math.comb(n, k) / 2**n > tail:
            break
        k += 1
    return ordered[k - 1], ordered[n - k]


def ratio(
    times: Sequence[Sequence[float]],
    i: int,
    j: int,
    *,
    confidence: float = CONFIDENCE,
    floor: float = REPRODUCIBLE,
) -> Ratio:
    """Contender ``i``'s time over contender ``j``'s, from interleaved ``times``
    (:func:`rounds`): the median of the per-round ratios and its :func:`median_interval`,
    reaching at least ``floor`` either side of the median (:data:`REPRODUCIBLE`; 0: the rounds'
    interval alone, for deciding whether more rounds would tell the two apart)."""
    per_round = _per_round(times, i, j)
    median = statistics.median(per_round)
    low, high = median_interval(per_round, confidence)
    # One round too: its ratio alone is no more reproducible (shown, it has no interval).
    low, high = min(low, median / (1 + floor)), max(high, median * (1 + floor))
    return Ratio(median, low, high, len(per_round))


@dataclass(frozen=True)
class Compared:
    """A baseline against a tuned callable in alternating rounds: each one's median time and
    the speedup (baseline over tuned; above 1 the tuned one is faster) with its interval."""

    baseline_ms: float
    tuned_ms: float
    speedup: Ratio
    timed: int = 0  # the rounds run: those past speedup.rounds were disturbed, left out

    def left_out(self) -> str:
        """``", 1 of 5 left out as disturbed"`` where a round was (else ``""``): the median of
        "the 4 rounds' ratios" read as a comparison cut short of its 5 rounds."""
        out = self.timed - self.speedup.rounds
        return f", {out} of {self.timed} left out as disturbed" if out > 0 else ""

    def text(self, than: str = "", times: str = "x") -> str:
        """The speedup as :func:`tunecache.timing.speedup_text` says it, with its interval (a
        comparison of one round has none, and says so: a bare ratio reads as certain)."""
        if self.speedup.rounds <= 1:
            return speedup_text(self.speedup.median, times, than=than) + ONE_ROUND
        interval = (self.speedup.low, self.speedup.high)
        return speedup_text(self.speedup.median, times, interval=interval, than=than)


def compare(baseline: Callable[[], float], tuned: Callable[[], float],
            count: int = ROUNDS) -> Compared:  # fmt: skip
    """Times ``baseline()`` and ``tuned()`` (each returns milliseconds) in ``count`` alternating
    rounds (:func:`rounds`), and more (up to :data:`MAX_ROUNDS`) while fewer than
    :data:`MIN_ROUNDS` were undisturbed: one round of five left "1.04x slower (one round)"."""

    def time_one(i: int) -> float:
        return (baseline, tuned)[i]()

    times = rounds(time_one, 2, count)
    while len(quiet(times)) < min(MIN_ROUNDS, count) and len(times) < MAX_ROUNDS:
        times += rounds(time_one, 2, min(count, MAX_ROUNDS - len(times)), first=len(times))
    kept = quiet(times)
    return Compared(statistics.median(row[0] for row in kept),
                    statistics.median(row[1] for row in kept), ratio(times, 0, 1),
                    timed=len(times))  # fmt: skip
