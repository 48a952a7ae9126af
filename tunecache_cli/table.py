"""Plain-text tables for the CLI's output, and :func:`shown`: text that came from a server (or
any outside source) as a terminal should print it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tunecache.strict import shown

__all__ = ["digits_apart", "ms", "ratio", "render", "shown"]

MOST_DIGITS = 7  # past this, two times printed alike are alike for any reader


def render(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces, with a rule under the header; a control
    character in a cell is escaped (:func:`shown`), so no cell breaks its line or its table."""
    cells = [[shown(str(c)) for c in header], *[[shown(str(c)) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def ms(value: float | None, digits: int = 3) -> str:
    """Milliseconds with ``digits`` significant digits (three by default); ``-`` for none."""
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if value >= 0.001 else f"{value:.{digits - 1}e}"


def digits_apart(values: Iterable[float | None]) -> int:
    """The fewest significant digits, three or more, at which :func:`ms` prints the different
    ``values`` differently (0.1 and 0.1004 need four: at three both read ``0.1``)."""
    distinct = {v for v in values if v is not None}
    for digits in range(3, MOST_DIGITS):
        if len({ms(v, digits) for v in distinct}) == len(distinct):
            return digits
    return MOST_DIGITS


def ratio(value: float) -> str:
    """A ratio of two times: two decimals below 100, more where two would round it to 1
    (``1.004x``, not ``1.00x``); a whole number with thousands separators from 100 up
    (``2,000x``, not ``2e+03x``)."""
    if value >= 99.995:  # what two decimals would print as 100.00
        return f"{value:,.0f}x"
    places = 2
    while places < MOST_DIGITS and value != 1 and f"{value:.{places}f}" == f"{1:.{places}f}":
        places += 1
    return f"{value:.{places}f}x"


def counted(count: int, noun: str) -> str:
    """``"1 check"``, ``"4 checks"`` (it said "1 checks", "1 keys")."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
