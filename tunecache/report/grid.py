"""The coverage grid: one row per kernel × shape, one column per backend × dtype × device arch,
each cell a status.

From a manifest the statuses are those of ``tunecache coverage`` (tuned, stale, queued, failed,
missing); from the records alone a key is *tuned* (it has a validated winner) or *unvalidated*
(records, none validated). Where several keys fall in one cell (other device names or versions of
one arch) the cell shows the best of their statuses; a cell no key falls in is empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tunecache.key import problem_text, source_labels
from tunecache.report.labels import KeyLike, natural
from tunecache.schemas import KeyModel, RecordPublic

# Best first: a cell shows the first of these its keys have.
STATUSES = ("tuned", "stale", "queued", "failed", "unvalidated", "missing")


@dataclass(frozen=True)
class CoverageGrid:
    """Rows and columns in display order, and the status of each filled ``(row, column)``."""

    rows: tuple[str, ...]
    columns: tuple[str, ...]
    cells: Mapping[tuple[int, int], str]

    def counts(self) -> dict[str, int]:
        """How many cells have each status (statuses with none left out)."""
        found = list(self.cells.values())
        return {status: found.count(status) for status in STATUSES if status in found}


def row_of(key: KeyLike) -> str:
    """``"matmul M=64,N=64,K=64"``."""
    return f"{key.kernel} {problem_text(key.problem)}"


def column_of(key: KeyLike) -> str:
    """``"tvm float32 cpu-avx2"``."""
    return f"{key.backend} {key.dtype} {key.device.arch}"


def coverage_grid(states: Iterable[tuple[KeyLike, str]]) -> CoverageGrid:
    """The grid of ``(key, status)`` pairs, rows and columns sorted by name (numbers as numbers).
    Keys of one kernel, shape and backend whose code differs (their source hashes) are rows of
    their own, each naming its source: a record of another version of the kernel is never served
    for this one, and merged into one cell it showed a teammate's untuned key *tuned*. A built-in
    kernel's backends each hash their own code: two backends' sources are no two versions.

    Raises:
        ValueError: a status not in :data:`STATUSES`.
    """
    states = list(states)
    sources: dict[tuple[str, str], set[str]] = {}
    for key, _ in states:
        sources.setdefault((row_of(key), key.backend), set()).add(key.source_hash)
    labels = {mine: source_labels(hashes) for mine, hashes in sources.items()}
    best: dict[tuple[str, str], str] = {}
    for key, status in states:
        if status not in STATUSES:
            raise ValueError(f"unknown coverage status {status!r}")
        row = row_of(key)
        mine = (row, key.backend)
        if len(sources[mine]) > 1:  # another version of the kernel's code: never served for it
            row += f" (source {labels[mine][key.source_hash]})"
        cell = (row, column_of(key))
        held = best.get(cell)
        if held is None or STATUSES.index(status) < STATUSES.index(held):
            best[cell] = status
    rows = tuple(sorted({row for row, _ in best}, key=natural))
    columns = tuple(sorted({column for _, column in best}, key=natural))
    at_row = {row: i for i, row in enumerate(rows)}
    at_column = {column: j for j, column in enumerate(columns)}
    cells = {(at_row[row], at_column[column]): s for (row, column), s in best.items()}
    return CoverageGrid(rows, columns, cells)


def record_states(records: Sequence[RecordPublic]) -> list[tuple[KeyModel, str]]:
    """Each key of ``records`` once: *tuned* when one of its records is the winner, else
    *unvalidated*."""
    keys: dict[str, KeyModel] = {}
    tuned: set[str] = set()
    for record in records:
        keys.setdefault(record.key_hash, record.key)
        if record.is_winner:
            tuned.add(record.key_hash)
    return [(key, "tuned" if h in tuned else "unvalidated") for h, key in keys.items()]
