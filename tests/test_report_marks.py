"""``tunecache report``'s speedup figure says what each bar is: a record no verifier vouches for
is marked pending, a speedup without an interval is hatched (and the caption says what hatching
means), and every speedup of a record Triton's interpreter timed says so beside it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.factories import make_key, make_record, timing
from tunecache.believed import UPLOADERS
from tunecache.measured import INTERPRETER_TIMER, BaselineModel
from tunecache.measured import Speedup as Measured
from tunecache.report import speedups
from tunecache.report.series import Speedup
from tunecache.schemas import RecordPublic, VerificationPublic

figures = pytest.importorskip("tunecache.report.figures")  # matplotlib, the report extra
UPLOADER_HATCH = getattr(figures, "UPLOADER_HATCH", "..")


def _public(*, status: str, m: int = 64, interval: bool = True, **update: Any) -> RecordPublic:
    """A winner 2x faster than torch eager (an interleaved comparison with ``interval``, else two
    medians timed apart) and 1.5x faster than its default config (two medians timed apart)."""
    compared = Measured(median=2.0, low=1.9, high=2.1, rounds=15) if interval else None
    created = make_record(make_key(m=m), time_ms=1.0).model_copy(update={"baselines": [
        BaselineModel(name="torch_eager", timing=timing(2.0), speedup=compared),
        BaselineModel(name="default_config", timing=timing(1.5)),
    ], **update})  # fmt: skip
    return RecordPublic.model_validate({**created.model_dump(), "id": m, "status": status,
                                        "key_hash": created.key.digest(), "is_winner": True,
                                        "uploaded_by": "mallory",
                                        "created_at": datetime.now(UTC)})  # fmt: skip


def _axes(rows: list[Speedup]) -> Any:
    """The axes of the speedup figure ``tunecache report`` draws of ``rows`` (as it saves it)."""
    drawn: list[Any] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(figures, "save", lambda fig, path: drawn.append(fig))
        figures.draw_speedup(rows, Path("speedup.png"))
    (ax,) = drawn[0].axes
    return ax


def _texts(rows: list[Speedup]) -> tuple[list[str], list[str], str, list[str]]:
    """The figure's key labels, bar annotations, x caption and legend entries."""
    ax = _axes(rows)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    notes = [t.get_text() for t in ax.texts if "×" in t.get_text()]  # each bar's speedup
    (legend,) = ax.figure.legends
    caption = " ".join(ax.get_xlabel().split())  # its lines wrapped to fit the figure
    return labels, notes, caption, [t.get_text() for t in legend.get_texts()]


@pytest.mark.parametrize("keys", [1, 6, 40])
def test_every_text_of_the_speedup_figure_lies_within_it(keys: int) -> None:
    """Long key labels squeezed the bars to the right: the legend's entries and the caption's
    lines ran past the figure's right edge, and a slower bar's speedup, written to its left,
    over the keys' labels. Drawn as saved, every text lies within the figure, and no bar's
    speedup reaches left of 1x."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    rows = [
        Speedup(f"matmul[K=4096,M={64 * (i + 1)},N=4096] float16 triton nvidia-h100-80gb-hbm3 sm_90",
                0.8 + 0.3 * i, 0.9 + 0.1 * i,
                default_interval=None if i % 2 else (0.7 + 0.3 * i, 0.95 + 0.3 * i),
                eager_interval=(0.8 + 0.1 * i, 1.0 + 0.1 * i), noisy=i == 1, interpreted=i == 2,
                status="pending" if i % 3 == 0 else "verified", retimed=i == 3,
                default_rounds=5, eager_rounds=12)
        for i in range(keys)
    ]  # fmt: skip
    fig = figures.speedup_figure(rows)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    inside = fig.bbox.padded(1)
    (ax,) = fig.axes
    low, high = ax.get_xlim()
    drawn_ticks = [t.label1 for t in ax.xaxis.get_major_ticks() if low <= t.get_loc() <= high]
    texts = [*ax.texts, ax.xaxis.label, *ax.get_yticklabels(), *drawn_ticks,
             *fig.legends[0].get_texts(), *fig.texts]  # fmt: skip
    texts = [t for t in texts if t.get_visible() and t.get_text().strip()]
    assert len(texts) > 3 * keys
    for text in texts:
        box = text.get_window_extent(renderer)
        assert inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1), (
            text.get_text(),
            box,
            fig.bbox,
        )
    one = ax.transData.transform((1.0, 0.0))[0]
    for note in (t for t in ax.texts if "×" in t.get_text()):
        assert note.get_window_extent(renderer).x0 >= one, note.get_text()


def test_a_pending_winner_is_marked_pending_in_its_label() -> None:
    """A write token's pending record claiming 1000x speedups stood in the figure like a
    verified one."""
    rows = speedups([_public(status="pending", m=32), _public(status="verified", m=64)])
    labels, _, _, _ = _texts(rows)
    assert labels[0].endswith(" (pending)") and "pending" not in labels[1]


def test_a_speedup_without_an_interval_is_hatched_and_the_caption_says_so() -> None:
    """Ratios of two medians timed apart were drawn like the interleaved comparison's medians,
    under a caption calling every bar a "median of alternating rounds, with its 95 % interval"."""
    rows = speedups([_public(status="verified")])
    hatches = [p.get_hatch() for p in _axes(rows).patches]
    assert hatches[0] and not hatches[1]  # default config: no interval; eager: one
    _, _, caption, legend = _texts(rows)
    assert "hatched: no interval (two medians timed apart, or a single round)" in caption
    assert "solid: median of alternating rounds, with its 95 % interval" in caption
    assert any(entry.startswith("hatched") for entry in legend)
    # Every bar with an interval: nothing hatched, and the caption says nothing of hatching.
    both = Speedup("k", 1.5, 2.0, default_interval=(1.4, 1.6), eager_interval=(1.9, 2.1))
    _, _, solid_only, legend = _texts([both])
    assert "hatched" not in solid_only and "alternating rounds" in solid_only
    assert not any(entry.startswith("hatched") for entry in legend)
    assert not any(p.get_hatch() for p in _axes([both]).patches)
    # No bar with one: the caption does not call any bar a median of alternating rounds.
    _, _, hatched_only, _ = _texts([Speedup("k", 1.5, 2.0)])
    assert "alternating rounds" not in hatched_only and "hatched" in hatched_only


def test_every_speedup_of_an_interpreted_record_says_interpreter() -> None:
    """The interpreter's mark was on the key's label only: "2.00x faster" stood beside the bar
    as a GPU speedup would."""
    record = _public(status="verified", interval=False)
    record = record.model_copy(update={"timing": timing(1.0).model_copy(
        update={"timer": INTERPRETER_TIMER})})  # fmt: skip
    _, notes, _, _ = _texts(speedups([record]))
    assert len(notes) == 2 and all(n.endswith(" (interpreter)") for n in notes)
    _, plain, _, _ = _texts(speedups([_public(status="verified", m=32)]))
    assert len(plain) == 2 and not any("interpreter" in n for n in plain)


def _verified(record: RecordPublic, ms: float, device: str = "amd-epyc-other") -> RecordPublic:
    """``record`` once a verifier passed it, timing it at ``ms`` on ``device``."""
    check = VerificationPublic(passed=True, verifier="ver", device_name=device,
                               verified_at=datetime.now(UTC), timing=timing(ms),
                               time_ratio=ms / record.timing.median_ms)  # fmt: skip
    return record.model_copy(update={"status": "verified", "verification": check})


def test_a_verified_records_speedups_are_marked_as_the_uploaders() -> None:
    """The audit's t1 and t3: mallory's record claimed 1000x over eager, and a verifier passed it
    with its own time, taken on another machine. ``get``, ``records`` and the dashboard say the
    speedup is the uploader's, not re-timed by the verifier; the report drew it as a solid bar
    under "baseline time / winner time" with no caveat. Each of its bars is now marked so,
    and the legend says what the mark means."""
    record = _verified(_public(status="pending", m=64), 1.02)
    plain = _public(status="verified", m=32)
    rows = speedups([plain, record])
    labels, notes, _, legend = _texts(rows)
    assert len(notes) == 4
    mine = [n for n in notes if "uploader" in n]
    assert len(mine) == 2 and all(n.endswith(" (uploader's)") for n in mine)
    assert any(UPLOADERS in entry for entry in legend), legend
    hatches = [p.get_hatch() for p in _axes(rows).patches]
    # the verified record's two bars, and no other (hatched apart from lacking an interval)
    assert sum(UPLOADER_HATCH in (h or "") for h in hatches) == 2
    assert "uploader" not in labels[0] and "uploader" in labels[1]
    mallory = _public(status="verified", m=64)  # uploaded by a trusted token: not re-timed
    assert not any("uploader" in n for n in _texts(speedups([mallory]))[1])


def _eager_speedup(speedup: Measured) -> RecordPublic:
    """A verified record whose comparison with torch eager found ``speedup``."""
    record = _public(status="verified")
    (eager, default) = record.baselines
    eager = eager.model_copy(update={"speedup": speedup})
    return record.model_copy(update={"baselines": [eager, default]})


def test_the_caption_gives_the_confidence_its_rounds_have() -> None:
    """A bar of 5 interleaved rounds stood under "with its 95 % interval": the interval of the
    median of 5 rounds is their whole range, 93.8 %."""
    record = _eager_speedup(Measured(median=2.0, low=1.9, high=2.1, rounds=5))
    _, _, caption, _ = _texts(speedups([record]))
    assert "95 %" not in caption
    assert "93.8 % interval (the whole range of 5 rounds)" in caption
    _, _, fifteen, _ = _texts(speedups([_public(status="verified")]))
    assert "with its 95 % interval" in fifteen


def test_a_small_speedup_is_drawn_with_the_digits_that_tell_it_from_1() -> None:
    """1.004x (1.001-1.007x) read "1.00× faster (1.00-1.01×)" beside its bar."""
    record = _eager_speedup(Measured(median=1.004, low=1.001, high=1.007, rounds=15))
    _, notes, _, _ = _texts(speedups([record]))
    assert "1.004× faster (1.001-1.007×)" in notes


@pytest.mark.parametrize("interval", [(0.5, 1e6), (1e-11, 9.9e11), (1e-300, 1e300)])
def test_a_hostile_interval_is_drawn_not_raised(interval: tuple[float, float]) -> None:
    """A pending upload may claim any interval the schemas admit: the axis widened for its
    note by compounding, and (0.5, 1e6) on an interpreted, re-timed record raised
    OverflowError, so ``tunecache report`` failed for everyone."""
    import math

    row = Speedup("k", 0.9, 0.9, interval, interval, interpreted=True, retimed=True,
                  noisy=True, status="pending", default_rounds=5, eager_rounds=5)  # fmt: skip
    fig = figures.speedup_figure([row])
    right = fig.axes[0].get_xlim()[1]
    assert math.isfinite(right) and right <= 1e300
