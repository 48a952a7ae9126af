"""Plain-text tables for the CLI's output, and :func:`shown`: text that came from a server (or
any outside source) as a terminal should print it."""

from __future__ import annotations

from collections.abc import Sequence

from tunecache.strict import shown

__all__ = ["ms", "render", "shown"]


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


def ms(value: float | None) -> str:
    """Milliseconds with three significant digits; ``-`` for none."""
    if value is None:
        return "-"
    return f"{value:.3g}" if value >= 0.001 else f"{value:.2e}"
