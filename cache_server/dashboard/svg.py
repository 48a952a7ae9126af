"""A search's convergence plot as inline SVG, drawn on the server: no script, no chart library.

The path is the best time found so far after each trial, one vertex per trial from the first
that ran; dots are the trials' own times, ticks under the axis the trials that failed. The time
axis is logarithmic when the times span more than ten-fold. Every piece of text in the SVG is a
number this module formats, so it needs no escaping.

Example:
    >>> svg = convergence_svg([3.0, None, 2.0, 2.5])
    >>> svg.count(" L")  # vertices after the first: trials 2, 3 and 4
    3
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup

from tunecache.timing import best_so_far
from tunecache.trialcount import count_text

WIDTH, HEIGHT = 720, 260
LEFT, RIGHT, TOP, BOTTOM = 70, 16, 14, 40


@dataclass(frozen=True)
class _Axes:
    """Trial number and time to pixels."""

    trials: int
    low: float
    high: float
    log: bool

    def x(self, trial: int) -> float:
        width = WIDTH - LEFT - RIGHT
        return LEFT + (width / 2 if self.trials == 1 else (trial - 1) * width / (self.trials - 1))

    def _scaled(self, time: float) -> float:
        return math.log10(time) if self.log else time

    def y(self, time: float) -> float:
        low, high = self._scaled(self.low), self._scaled(self.high)
        share = 0.5 if high == low else (self._scaled(time) - low) / (high - low)
        return TOP + (1 - share) * (HEIGHT - TOP - BOTTOM)

    def ticks(self) -> list[float]:
        if self.high == self.low:
            return [self.low]
        middle = math.sqrt(self.low * self.high) if self.log else (self.low + self.high) / 2
        return [self.low, middle, self.high]


def _frame(axes: _Axes) -> list[str]:
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    parts = [f'<path class="axis" d="M{LEFT},{TOP} V{bottom} H{right}"/>']
    for tick in axes.ticks():
        y = axes.y(tick)
        parts.append(f'<path class="grid" d="M{LEFT},{y:.1f} H{right}"/>')
        parts.append(f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" '
                     f'text-anchor="end">{tick:.4g}</text>')  # fmt: skip
    for trial in sorted({1, axes.trials}):
        parts.append(f'<text class="tick" x="{axes.x(trial):.1f}" y="{bottom + 16}" '
                     f'text-anchor="middle">{trial}</text>')  # fmt: skip
    scale = "ms, log scale" if axes.log else "ms"
    parts.append(f'<text class="label" x="{(LEFT + right) / 2}" y="{HEIGHT - 4}" '
                 f'text-anchor="middle">trial</text>')  # fmt: skip
    middle = (TOP + bottom) / 2
    parts.append(f'<text class="label" x="12" y="{middle}" text-anchor="middle" '
                 f'transform="rotate(-90 12 {middle})">time ({scale})</text>')  # fmt: skip
    return parts


def convergence_svg(times: Sequence[float | None], default: bool = False) -> Markup | None:
    """The plot of trials that took ``times`` (``None``: the trial failed), or ``None`` when no
    trial ran; ``default``: the last is the default config's timing, counted apart in the title
    as the page counts it (:func:`tunecache.trialcount.count_text`)."""
    ran = [t for t in times if t is not None]
    if not ran:
        return None
    low, high = min(ran), max(ran)
    axes = _Axes(trials=len(times), low=low, high=high, log=high > 10 * low)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-labelledby="plot-title">',
        f'<title id="plot-title">Best time so far over {count_text(len(times), default)}: '
        f"{low:.4g} ms at best</title>",
        *_frame(axes),
    ]
    vertices = [
        f"{axes.x(i):.1f},{axes.y(best):.1f}"
        for i, best in enumerate(best_so_far(times), start=1)
        if best is not None
    ]
    parts.append(f'<path class="best" d="M{" L".join(vertices)}"/>')
    for i, time in enumerate(times, start=1):
        x = axes.x(i)
        if time is None:
            parts.append(f'<path class="failed" d="M{x:.1f},{HEIGHT - BOTTOM + 2} v6"/>')
        else:
            parts.append(f'<circle class="trial" cx="{x:.1f}" cy="{axes.y(time):.1f}" r="2.5"/>')
    parts.append("</svg>")
    return Markup("\n".join(parts))
