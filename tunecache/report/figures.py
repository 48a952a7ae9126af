"""Draws the report's figures on matplotlib's Agg canvas: no display, no pyplot state.

Each ``draw_*`` takes the numbers of :mod:`tunecache.report.series` or
:mod:`tunecache.report.grid`, writes one PNG atomically (a temp file beside it, then
``os.replace``: a reader never sees half a file) and returns what the figure shows, in words.
This is the only module of tunecache that imports matplotlib.
"""

from __future__ import annotations

import math
import os
import textwrap
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from tunecache import believed
from tunecache.report.grid import STATUSES, CoverageGrid
from tunecache.report.labels import fair_first
from tunecache.report.series import MAX_CONVERGENCE_KEYS, Convergence, Interval, Speedup
from tunecache.timing import speedup_text

DPI = 110
MAX_SPEEDUP_ROWS = 60
MAX_GRID_ROWS = 80
MAX_GRID_COLUMNS = 30  # 480 columns (one key each, 3 s of uploads) drew 66,643 px and 760 MB
BASELINE_COLORS = {"default config": "#4c72b0", "torch eager": "#dd8452"}
STATUS_COLORS = {"tuned": "#2ca02c", "stale": "#f0c419", "queued": "#5dade2", "failed": "#d62728",
                 "unvalidated": "#9467bd", "missing": "#c8c8c8"}  # fmt: skip
EMPTY_COLOR = "#ffffff"
# Labels are the server's text (a user kernel's name, its problem): never TeX. One key whose
# problem read "$\\frac{1}{$" made every report fail in matplotlib's math parser.
PLAIN_TEXT = rc_context({"text.parse_math": False})


def save(fig: Figure, path: Path) -> None:
    """Writes ``fig`` to ``path`` as a PNG, atomically."""
    # Not mkstemp: its files are 0600, and a report is for sharing (this honours the umask).
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with tmp.open("xb") as out:
            fig.savefig(out, format="png", dpi=DPI)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def short(label: str, limit: int) -> str:
    """``label`` in at most ``limit`` characters, its middle elided: a long kernel name keeps
    its package and its shape, and never pushes a figure's axes off the page.

    Example:
        >>> short("mypkg.kernels.attention:FlashAttentionForward[B=8,H=32,S=4096]", 32)
        'mypkg.kernels.a…B=8,H=32,S=4096]'
    """
    if len(label) <= limit:
        return label
    head = (limit - 1) // 2
    return label[:head] + "…" + label[len(label) - (limit - 1 - head) :]


def shorts(labels: Sequence[str], limit: int) -> list[str]:
    """Each of ``labels`` in at most ``limit`` characters, told apart where :func:`short` would
    not: a label whose first difference from every other lies in the part :func:`short` elides
    keeps its head, then the text from the start of the parameter that difference is in.
    Labels of one kernel's keys differ in the middle (a Triton kernel's tuning key:
    ``n_cols=306`` before its pointers' dtypes): five bars read the same.

    Example:
        >>> shorts(["k triton float32 n=306,x.dtype=float32,y.dtype=float32",
        ...         "k triton float32 n=512,x.dtype=float32,y.dtype=float32"], 32)
        ['k triton f…n=306,x.dtype=float3…', 'k triton f…n=512,x.dtype=float3…']
    """
    shown = []
    for label in labels:
        apart = max((_common(label, other) for other in labels if other != label), default=0)
        head = (limit - 1) // 2
        if len(label) <= limit or apart < head or apart >= len(label) - (limit - 1 - head):
            shown.append(short(label, limit))  # its difference is shown as it is
            continue
        keep = limit // 3
        # From the start of the parameter the difference is in (at most 16 characters back)
        start = max(keep, apart - 16, *(label.rfind(c, 0, apart) + 1 for c in " ,[("))
        rest = label[start:]
        room = limit - keep - 1
        shown.append(label[:keep] + "…" + (rest if len(rest) <= room else rest[: room - 1] + "…"))
    # A window that met another label's (their differences elsewhere: float32 and float16 of
    # one n_cols) is no better than short(), which is kept there.
    taken = Counter(dict(zip(labels, shown, strict=True)).values())  # by distinct labels
    return [short(label, limit) if taken[text] > 1 else text
            for text, label in zip(shown, labels, strict=True)]  # fmt: skip


def _common(one: str, other: str) -> int:
    """How many characters ``one`` and ``other`` share from their start."""
    return next((i for i, (a, b) in enumerate(zip(one, other, strict=False)) if a != b),
                min(len(one), len(other)))  # fmt: skip


# A bar whose speedup has no interval (a ratio of two medians timed apart, or one round) is
# hatched, and the axis caption then says what the hatching means. A bar of a record a verifier
# re-timed is dotted too (over its hatching, if any): the ratio is its uploader's, over the
# uploader's own time, as `tunecache get` and the dashboard mark it.
NO_INTERVAL_HATCH = "///"
UPLOADER_HATCH = ".."
SOLID_CAPTION = "solid: median of alternating rounds, with its"  # then what its interval is
HATCHED_CAPTION = "hatched: no interval (two medians timed apart, or a single round)"
UPLOADER_CAPTION = f"dotted: {believed.UPLOADERS}"
CAPTION_WIDTH = 80  # characters a line of the speedup axis's caption holds


@PLAIN_TEXT
def draw_speedup(rows: Sequence[Speedup], path: Path) -> str:
    """Grouped horizontal bars from 1× to each key's speedup over each baseline (log x).

    A key without a baseline gets no bar for it, a grey note where the bar would be, and the
    legend counts the keys that have each baseline. A speedup without an interval is hatched;
    a record no verifier vouches for is marked ``(pending)`` in its label, one timed by
    Triton's interpreter ``(interpreter)`` beside each of its speedups too, and one a verifier
    re-timed is dotted and marked ``(uploader's)``: its ratios are its uploader's.
    """
    n = min(len(rows), MAX_SPEEDUP_ROWS)
    fig = speedup_figure(rows)
    save(fig, path)
    return f"speedup of the winners of {_count(n, 'key')} vs the default config and torch eager"


def speedup_figure(rows: Sequence[Speedup]) -> Figure:
    """The speedup figure of :func:`draw_speedup`, not yet saved."""
    shown = fair_first(rows, MAX_SPEEDUP_ROWS, label=lambda row: row.label,
                       verified=lambda row: row.status == "verified",
                       uploader=lambda row: row.uploader)  # fmt: skip
    n = len(shown)
    fig = Figure(figsize=(11, max(3.0, 1.8 + 0.45 * n)), layout="constrained")
    ax = fig.add_subplot()
    height = 0.38
    bars = (("default config", -height / 2, [r.vs_default for r in shown],
             [r.default_interval for r in shown], [r.default_rounds for r in shown]),
            ("torch eager", height / 2, [r.vs_eager for r in shown],
             [r.eager_interval for r in shown], [r.eager_rounds for r in shown]))  # fmt: skip
    values = [v for _, _, column, _, _ in bars for v in column if v is not None]
    values += [x for _, _, _, spans, _ in bars for span in spans if span is not None for x in span]
    hatched, solid_rounds = 0, []
    for name, offset, column, spans, counts in bars:
        _baseline_bars(ax, shown, name, offset, height, column, spans)
        hatched += sum(v is not None and s is None for v, s in zip(column, spans, strict=True))
        solid_rounds += [n for v, s, n in zip(column, spans, counts, strict=True)
                         if v is not None and s is not None]  # fmt: skip
    uploaders = sum(v is not None for _, _, column, _, _ in bars
                    for r, v in zip(shown, column, strict=True) if r.retimed)  # fmt: skip
    low, high = min([1.0, *map(on_scale, values)]), max([1.0, *map(on_scale, values)])
    ax.set_xscale("log")
    ax.set_xlim(low / 1.6, high * (2.4 if uploaders else 1.6))  # room for "(uploader's)"
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.axvline(1, color="black", linewidth=1)
    at_one = ax.get_xaxis_transform()  # x in data, y in axes fraction
    ax.text(1, 1.005, "  faster →", transform=at_one, ha="left", va="bottom", fontsize=9)
    ax.text(1, 1.005, "← slower  ", transform=at_one, ha="right", va="bottom", fontsize=9)
    labels = shorts([r.label for r in shown], 56)
    marked = [label + r.status_mark + r.caveat for label, r in zip(labels, shown, strict=True)]
    ax.set_yticks(range(n), marked, fontsize=8)
    ax.set_ylim(n - 0.5, -0.5)  # the first key on top
    caption = speedup_caption(solid=len(solid_rounds), hatched=hatched, rounds=solid_rounds,
                              uploaders=uploaders)  # fmt: skip
    ax.set_xlabel(caption, fontsize=9)
    handles, _ = ax.get_legend_handles_labels()
    for count, hatch, caption in ((hatched, NO_INTERVAL_HATCH, HATCHED_CAPTION),
                                  (uploaders, UPLOADER_HATCH, UPLOADER_CAPTION)):  # fmt: skip
        if count:
            handles.append(Patch(facecolor="white", edgecolor="grey", hatch=hatch,
                                 label=f"{caption} ({count} bars)"))  # fmt: skip
    # Below the caption, where it hides no bar, centred on the figure, which the layout makes
    # room for: centred on the axes above them, its long entries ran past the figure's edge.
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8)
    # room for the caption's lines and the legend's rows, below the bars' own
    width, height = fig.get_size_inches()
    fig.set_size_inches(width, height + 0.17 * caption.count("\n") + 0.2 * len(handles) / 2)
    _fit_notes(fig, ax)
    kept = f" ({n} of {len(rows)} keys: verified first, then each uploader's in turn)"
    more = kept if len(rows) > n else ""
    fig.suptitle(f"Speedup per key vs the default config and torch eager{more}")
    return fig


def _fit_notes(fig: Figure, ax: Axes, tries: int = 3) -> None:
    """Widens the log axis to the right until every bar's note ends inside it, as drawn: a long
    note ("the same within noise (median 0.90×, 0.80-1.00×)") beside the largest speedup ran
    past the figure's edge. A note starting at ``s`` of the axis's log span, ``w`` of its width
    long, fits a span of ``s / (1 - w)``; a note longer than 60 % of the axis is given that
    much, and the right end is never past ``1e300`` (a hostile record's 1e6-wide interval must
    not draw past what a float holds). A few draws: the layout moves as the limits change."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Annotation

    renderer = FigureCanvasAgg(fig).get_renderer()
    for _ in range(tries):
        fig.draw(renderer)  # lays the figure out as saved
        box = ax.get_window_extent(renderer)
        low, high = ax.get_xlim()
        span = needed = math.log(high) - math.log(low)  # not of high / low: that overflows
        for note in (t for t in ax.texts if isinstance(t, Annotation)):
            extent = note.get_window_extent(renderer)
            if extent.x1 <= box.x1 or box.width <= 0:
                continue
            start = math.log(float(note.xy[0])) - math.log(low)  # its anchor, in log units
            taken = min((extent.x1 - box.x0) / box.width - start / span, 0.6)  # its width
            needed = max(needed, start / (1 - taken))
        if needed <= span:
            return
        ax.set_xlim(low, math.exp(min(math.log(low) + needed * 1.02, MAX_LOG_LIMIT)))


MAX_LOG_LIMIT = math.log(1e300)  # the speedup axis's right end at most
# A speedup past this either way is drawn to it, its note saying its value and "off scale": one
# record's claim of 1e15x (a time of 1e-6 ms over baselines of 1e9 ms, which the schema admits)
# spread the axis over 30 decades, every other bar a sliver.
SPEEDUP_SCALE = 1e4


def on_scale(speedup: float) -> float:
    """``speedup`` within the axis's bounds (:data:`SPEEDUP_SCALE` either way)."""
    return min(max(speedup, 1 / SPEEDUP_SCALE), SPEEDUP_SCALE)


def off_scale_text(speedup: float) -> str:
    """A bar's note past the axis's bounds, short (a long one widened the axis again).

    Example:
        >>> off_scale_text(1e15), off_scale_text(2e-5)
        ('off scale: 1e+15× faster', 'off scale: 5e+04× slower')
    """
    factor, word = (speedup, "faster") if speedup >= 1 else (1 / speedup, "slower")
    return f"off scale: {factor:.3g}× {word}"


def speedup_caption(*, solid: int, hatched: int, rounds: Sequence[int | None] = (),
                    uploaders: int = 0) -> str:  # fmt: skip
    """The speedup axis's caption: what a solid bar is, with the confidence its rounds give
    (:func:`tunecache.believed.interval_label`: the whole range of 5 rounds is no 95 %
    interval), what a hatched one is when any is drawn (a bar without an interval is not the
    median of alternating rounds), and a dotted one (its uploader's ratio, over its uploader's
    time: not the winner time the server ranks it by)."""
    parts = [f"{SOLID_CAPTION} {_interval_words(rounds)}"] if solid or not hatched else []
    parts += [HATCHED_CAPTION] if hatched else []
    parts += [UPLOADER_CAPTION] if uploaders else []
    lines = ["speedup of the tuned winner: baseline time / winner time (log scale)", *parts]
    return "\n".join(textwrap.fill(line, CAPTION_WIDTH) for line in lines)  # it ran off the figure


def _interval_words(rounds: Sequence[int | None]) -> str:
    """``95 % interval``, or each confidence the bars' rounds give, widest first
    (``95 % interval or 93.8 % interval (the whole range of 5 rounds)``); ``interval`` where
    the rounds are not known."""
    known = sorted({n for n in rounds if n is not None}, key=believed.coverage, reverse=True)
    labels = list(dict.fromkeys(believed.interval_label(n) for n in known))
    if any(n is None for n in rounds) or not labels:
        labels.append("interval")
    return " or ".join(labels)


def _baseline_bars(
    ax: Axes,
    shown: Sequence[Speedup],
    name: str,
    offset: float,
    height: float,
    column: Sequence[float | None],
    spans: Sequence[Interval | None],
) -> None:
    """One baseline's bars: solid with an interval, hatched without; each annotated with its
    speedup (and ``(interpreter)`` for a record Triton's interpreter timed)."""
    n = len(shown)
    have = [(i, v) for i, v in enumerate(column) if v is not None]
    lacking = n - len(have)
    label = f"vs {name} ({len(have)} of {n} keys"
    label += f"; {lacking} without this baseline: no bar)" if lacking else ")"
    drawn = ax.barh([i + offset for i, _ in have], [on_scale(v) - 1 for _, v in have], left=1,
                    height=height, color=BASELINE_COLORS[name], label=label)  # fmt: skip
    for (i, v), bar in zip(have, drawn.patches, strict=True):
        span = spans[i]
        hatch = (NO_INTERVAL_HATCH if span is None else "") + (
            UPLOADER_HATCH if shown[i].retimed else "")  # fmt: skip
        if hatch:
            bar.set_hatch(hatch)
            bar.set_edgecolor("white")
        if span is not None:  # the interval of the interleaved comparison
            ax.errorbar(v, i + offset, xerr=[[v - span[0]], [span[1] - v]], fmt="none",
                        ecolor="black", elinewidth=0.8, capsize=2)  # fmt: skip
        # Right of the bar, or of 1x for a slower one (its side is empty there): drawn left of
        # a slower bar, the text ran over the keys' labels.
        edge = max(1.0, on_scale(v if span is None else span[1]))
        text = speedup_text(v, "×", interval=span) if on_scale(v) == v else off_scale_text(v)
        text += " (interpreter)" if shown[i].interpreted else ""
        text += f" ({believed.UPLOADERS_MARK})" if shown[i].retimed else ""
        ax.annotate(text, (edge, i + offset), xytext=(3, 0), textcoords="offset points",
                    ha="left", va="center", fontsize=7)  # fmt: skip
    for i in (i for i, v in enumerate(column) if v is None):
        ax.annotate(f"no {name} baseline", (1, i + offset), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=7, color="grey",
                    style="italic")  # fmt: skip


@PLAIN_TEXT
def draw_convergence(
    series: Sequence[Convergence], path: Path, *, not_shown: int = 0, without_trials: int = 0
) -> str:
    """Small multiples, one per key: the best time so far after each trial, relative to the best
    found (1 = the search's best); failed trials add no point, and each panel says how many.

    Args:
        not_shown: keys left out (over the cap, or without trials), said in the title.
        without_trials: how many of ``not_shown`` had no successful trial recorded.
    """
    shown = list(series[:MAX_CONVERGENCE_KEYS])
    not_shown += len(series) - len(shown)
    columns = min(4, len(shown))
    rows = math.ceil(len(shown) / columns)
    fig = Figure(figsize=(max(7.0, 3.3 * columns + 0.8), 2.6 * rows + 1.0), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False, sharey=True)
    top = max(max(s.relative) for s in shown)
    titles = shorts([s.label for s in shown], 44)
    for ax, s, color, title in zip(axes.flat, shown, _palette(len(shown)), titles, strict=False):
        ax.step(s.trials, s.relative, where="post", marker=".", color=color, linewidth=1.5)
        ax.axhline(1, color="grey", linestyle=":", linewidth=1)
        ax.set_title(title, fontsize=8)
        ax.set_xlim(0.5, max(s.trials[-1], s.trials[0] + 1) + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if s.failed:
            ax.text(0.97, 0.95, f"{s.failed} failed skipped", transform=ax.transAxes,
                    ha="right", va="top", fontsize=7, color="grey")  # fmt: skip
    for ax in list(axes.flat)[len(shown) :]:
        ax.set_visible(False)
    axes[0][0].set_yscale("log")
    axes[0][0].set_ylim(0.92, max(top * 1.15, 1.25))
    axes[0][0].yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
    axes[0][0].yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
    fig.supxlabel("trial number in the search", fontsize=9)
    fig.supylabel("best time so far / best found", fontsize=9)
    title = f"Search convergence of {_count(len(shown), 'key')}"
    if not_shown:
        title += f"; {not_shown} more not shown"
        title += f" ({without_trials} without recorded trials)" if without_trials else ""
    fig.suptitle(title)
    save(fig, path)
    return f"search convergence (best time so far per trial) of {_count(len(shown), 'key')}"


@PLAIN_TEXT
def draw_coverage(grid: CoverageGrid, path: Path, *, source: str) -> str:
    """The grid as coloured cells, the status written in each; an empty cell is white.

    Args:
        source: where the statuses come from (``"records"``, ``"manifest M.toml"``), for the title.
    """
    rows, columns, cells = _shown_cells(grid)
    codes = np.zeros((len(rows), len(columns)))
    for (i, j), status in cells.items():
        codes[i, j] = STATUSES.index(status) + 1
    colors = [EMPTY_COLOR, *(STATUS_COLORS[s] for s in STATUSES)]
    width = 3.0 + 1.25 * len(columns) + 1.6
    fig = Figure(figsize=(max(width, 7.0), max(3.0, 1.8 + 0.32 * len(rows))), layout="constrained")
    ax = fig.add_subplot()
    ax.imshow(codes, cmap=ListedColormap(colors), vmin=-0.5, vmax=len(colors) - 0.5,
              aspect="auto", interpolation="nearest")  # fmt: skip
    for (i, j), status in cells.items():
        ax.text(j, i, status, ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(columns)), shorts(columns, 32), rotation=30,
                  ha="right", fontsize=8)  # fmt: skip
    ax.set_yticks(range(len(rows)), shorts(rows, 56), fontsize=8)
    ax.set_xticks(np.arange(-0.5, len(columns)), minor=True)
    ax.set_yticks(np.arange(-0.5, len(rows)), minor=True)
    ax.grid(which="minor", color="#eeeeee", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    counts = grid.counts()
    handles = [Patch(color=STATUS_COLORS[s], label=f"{s} ({n})") for s, n in counts.items()]
    if len(cells) < len(rows) * len(columns):
        handles.append(Patch(facecolor=EMPTY_COLOR, edgecolor="grey", label="no key"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    more = ""
    if (len(rows), len(columns)) != (len(grid.rows), len(grid.columns)):
        more = (f"; {len(rows)} of {len(grid.rows)} rows × {len(columns)} of "
                f"{len(grid.columns)} columns, those of most keys")  # fmt: skip
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    fig.suptitle(f"Coverage from {source}: {summary}{more}")
    save(fig, path)
    shape = f"{_count(len(grid.rows), 'kernel shape')} × "
    shape += _count(len(grid.columns), "backend/dtype/arch column")
    if (len(rows), len(columns)) != (len(grid.rows), len(grid.columns)):
        shape += f" ({len(rows)} × {len(columns)} drawn)"
    return f"coverage grid, {shape}, from {source}: {summary}"


def _shown_cells(
    grid: CoverageGrid,
) -> tuple[list[str], list[str], dict[tuple[int, int], str]]:
    """The rows and columns drawn, at most :data:`MAX_GRID_ROWS` × :data:`MAX_GRID_COLUMNS`:
    those with the most filled cells, rows of equal counts each kernel's in turn (kept by name
    alone, one token's kernel named to sort first, at 80 shapes, took every row), in the grid's
    order, and their cells."""
    kernels = [row.split(" ", 1)[0] for row in grid.rows]  # a row is "kernel shape"
    kept_rows = _most_filled([i for i, _ in grid.cells], MAX_GRID_ROWS, kernels)
    kept_columns = _most_filled([j for _, j in grid.cells], MAX_GRID_COLUMNS, grid.columns)
    row_at = {i: at for at, i in enumerate(kept_rows)}
    column_at = {j: at for at, j in enumerate(kept_columns)}
    cells = {(row_at[i], column_at[j]): status for (i, j), status in grid.cells.items()
             if i in row_at and j in column_at}  # fmt: skip
    return ([grid.rows[i] for i in kept_rows], [grid.columns[j] for j in kept_columns], cells)


def _most_filled(filled: Sequence[int], limit: int, groups: Sequence[str]) -> list[int]:
    """The ``limit`` indices of ``groups`` that ``filled`` names most often, each group's in
    turn among equals (its first, then each one's second, …), the first among those; in order."""
    if len(groups) <= limit:
        return list(range(len(groups)))
    counts, turns = Counter(filled), Counter[str]()
    ranked = []
    for i, group in enumerate(groups):
        ranked.append((-counts[i], turns[group], i))
        turns[group] += 1
    return sorted(i for *_, i in sorted(ranked)[:limit])


def _count(n: int, noun: str) -> str:
    """``"1 key"``, ``"2 keys"``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _palette(n: int) -> list[str]:
    """``n`` distinct colours (tab10, then tab20's lighter ones)."""
    tab = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78"]  # fmt: skip
    return [tab[i % len(tab)] for i in range(n)]
