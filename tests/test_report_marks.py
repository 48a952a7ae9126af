"""``tunecache report``'s speedup figure says what each bar is: a record no verifier vouches for
is marked pending, a speedup without an interval is hatched (and the caption says what hatching
means), and every speedup of a record Triton's interpreter timed says so beside it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.factories import make_key, make_record, timing
from tunecache.measured import INTERPRETER_TIMER, BaselineModel
from tunecache.measured import Speedup as Measured
from tunecache.report import speedups
from tunecache.report.series import Speedup
from tunecache.schemas import RecordPublic

figures = pytest.importorskip("tunecache.report.figures")  # matplotlib, the report extra


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
    legend = ax.get_legend()
    return labels, notes, ax.get_xlabel(), [t.get_text() for t in legend.get_texts()]


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
