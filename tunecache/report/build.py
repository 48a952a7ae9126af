"""Writes the report's PNGs into a folder: what to draw from what was read, and where.

A figure with nothing to show (no winner, no winner with a baseline or with trials, no key in the
grid) is not written; the reason comes back instead, so the command can say it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tunecache.errors import InvalidInput
from tunecache.report.collect import Searches
from tunecache.report.grid import coverage_grid
from tunecache.report.labels import KeyLike
from tunecache.report.series import speedups
from tunecache.schemas import RecordPublic

INSTALL_HINT = "pip install matplotlib (the report extra: pip install -e '.[report]')"


@dataclass(frozen=True)
class Written:
    """One file written, and what it shows."""

    path: Path
    what: str


@dataclass
class Report:
    """The files written and, for each figure not written, why."""

    written: list[Written] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def require_matplotlib() -> None:
    """Raises :class:`InvalidInput` with the install command when matplotlib is missing."""
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        raise InvalidInput(f"the report needs matplotlib: {INSTALL_HINT}") from None


def write_report(
    out: Path,
    *,
    winners: Sequence[RecordPublic],
    searches: Searches,
    states: Iterable[tuple[KeyLike, str]],
    source: str,
) -> Report:
    """Draws ``speedup.png``, ``convergence.png`` and ``coverage.png`` into ``out``.

    Args:
        winners: the winners of the keys (for the speedups).
        searches: the convergence series (:func:`tunecache.report.collect.fetch_searches`).
        states: each key with its coverage status, for the grid.
        source: where the statuses come from, for the grid's title.
    """
    from tunecache.report import figures  # matplotlib only now

    report = Report()
    rows = speedups(winners)
    if any(r.vs_default is not None or r.vs_eager is not None for r in rows):
        path = out / "speedup.png"
        report.written.append(Written(path, figures.draw_speedup(rows, path)))
    else:
        report.skipped.append("speedup.png not written: no winner has a baseline timing")
    if searches.series:
        path = out / "convergence.png"
        what = figures.draw_convergence(searches.series, path, not_shown=searches.not_shown,
                                        without_trials=searches.without_trials)  # fmt: skip
        report.written.append(Written(path, what))
    else:
        report.skipped.append("convergence.png not written: no winner has recorded trials")
    grid = coverage_grid(states)
    if grid.cells:
        path = out / "coverage.png"
        report.written.append(Written(path, figures.draw_coverage(grid, path, source=source)))
    else:
        report.skipped.append(f"coverage.png not written: no key of the {source} matches")
    return report
