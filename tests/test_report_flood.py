"""One uploader's records cannot take over or blow up another user's report.

A write token's 480 records of one key each (3 s of uploads), each under another device arch,
made the coverage figure 66,643 px wide (760 MB to draw; a few thousand would have run out of
memory); keys named to sort first ("A…") took every place of the speedup figure and of the
convergence panels, and one record's claim of a 1e15x speedup spread the speedup axis over 30
decades, every other bar a sliver. Found by a hostile review.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.factories import make_key
from tunecache.report.grid import coverage_grid
from tunecache.report.labels import natural
from tunecache.report.series import Speedup

figures = pytest.importorskip("tunecache.report.figures")  # matplotlib, the report extra


def _arch(key_m: int, arch: str) -> object:
    key = make_key(m=key_m)
    return key.__class__(**{**key.__dict__, "device": key.device.__class__(
        **{**key.device.__dict__, "arch": arch})})  # fmt: skip


def test_the_coverage_figure_keeps_the_columns_of_most_keys_and_a_bounded_size(
    tmp_path: Path,
) -> None:
    from PIL import Image

    team = [(make_key(m=64 * (i + 1)), "tuned") for i in range(4)]  # one column, four rows
    flood = [(_arch(4096 + i, f"a{i:04d}"), "tuned") for i in range(480)]
    grid = coverage_grid([*flood, *team])  # type: ignore[list-item]
    assert len(grid.columns) == 481
    path = tmp_path / "coverage.png"
    said = figures.draw_coverage(grid, path, source="records")
    assert "481 backend/dtype/arch columns" in said
    width, _ = Image.open(path).size
    limit = (3.0 + 1.25 * figures.MAX_GRID_COLUMNS + 1.6) * figures.DPI
    assert width <= limit * 1.05, width
    rows, columns, cells = figures._shown_cells(grid)
    assert len(columns) == figures.MAX_GRID_COLUMNS and len(rows) == figures.MAX_GRID_ROWS
    assert "tvm float32 cpu-avx2" in columns  # the team's, four keys
    assert all(f"matmul K=64,M={64 * (i + 1)},N=64" in rows for i in range(4))
    assert sum(1 for (_, j) in cells if columns[j] == "tvm float32 cpu-avx2") == 4


def test_verified_keys_keep_their_place_in_the_speedup_figure() -> None:
    flood = [Speedup(f"A{i:03d} tvm float32 M=64", 2.0, 2.0, status="pending")
             for i in range(80)]  # fmt: skip
    team = [Speedup(f"matmul tvm float32 M={m}", 1.5, 3.0) for m in (64, 128, 256)]
    fig = figures.speedup_figure(sorted([*flood, *team], key=lambda row: row.label))
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(labels) == figures.MAX_SPEEDUP_ROWS
    assert labels[-3:] == [row.label for row in team]  # kept, in name order
    assert "(60 of 83 keys: verified first, then each uploader's in turn)" in fig.get_suptitle()


def test_each_uploaders_keys_take_their_turn_where_none_is_verified() -> None:
    """A team with no verifier: every key pending, one token's 80 keys named to sort first."""
    flood = [Speedup(f"A{i:03d} tvm float32 M=64", 2.0, 2.0, status="pending", uploader="flood")
             for i in range(80)]  # fmt: skip
    team = [Speedup(f"matmul tvm float32 M={m}", 1.5, 3.0, status="pending", uploader=who)
            for m, who in ((64, "alice"), (128, "alice"), (256, "bob"))]  # fmt: skip
    fig = figures.speedup_figure(sorted([*flood, *team], key=lambda row: row.label))
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[-3:] == [f"{row.label} (pending)" for row in team], labels[-4:]


def test_each_kernels_shapes_take_their_turn_for_the_coverage_rows(tmp_path: Path) -> None:
    flood = [(make_key(m=8 * (i + 1), kernel="bias_gelu"), "tuned") for i in range(80)]
    team = [(make_key(m=64 * (i + 1)), "tuned") for i in range(5)]  # matmul sorts after it
    grid = coverage_grid([*flood, *team])  # type: ignore[list-item]
    rows, _, _ = figures._shown_cells(grid)
    assert sum(row.startswith("matmul") for row in rows) == 5 and len(rows) == 80
    said = figures.draw_coverage(grid, tmp_path / "coverage.png", source="records")
    assert "85 kernel shapes × 1 backend/dtype/arch column (80 × 1 drawn)" in said, said


def test_a_claim_off_the_scale_leaves_the_other_bars_readable() -> None:
    rows = [Speedup("A claims", 1e15, 1e-15, status="pending"), Speedup("matmul", 1.46, 2.0)]
    fig = figures.speedup_figure(rows)
    ax = fig.axes[0]
    low, high = ax.get_xlim()
    assert low >= 1 / figures.SPEEDUP_SCALE / 2 and high <= figures.SPEEDUP_SCALE * 100
    notes = [t.get_text() for t in ax.texts if "×" in t.get_text()]
    assert sorted(note for note in notes if "off scale" in note) == [
        "off scale: 1e+15× faster", "off scale: 1e+15× slower"]  # fmt: skip
    assert any(note.startswith("1.46×") for note in notes), notes


def test_verified_searches_keep_their_convergence_panels() -> None:
    """The panels went to the first winners by label (a flood of keys named to sort first took
    all twelve)."""
    from tests.test_report import public, record
    from tunecache.report.collect import fetch_searches

    winners = [public(record(make_key(m=16 * (i + 1)), 2.0, trials=[3.0, 2.0]),
                      i + 1).model_copy(update={"status": "pending"})
               for i in range(14)]  # fmt: skip
    verified = public(record(make_key(m=64, kernel="softmax"), 1.0, trials=[2.0, 1.0]), 99)
    winners.append(verified.model_copy(update={"status": "verified"}))

    class Server:  # the records as the server holds them, trials and all
        def get_record(self, record_id: int) -> object:
            return next(w for w in winners if w.id == record_id)

    searches = fetch_searches(Server(), winners, keys=12)
    labels = [found.label for found in searches.series]
    assert len(labels) == 12 and labels == sorted(labels, key=natural)
    assert labels[-1] == "softmax tvm float32 M=64,N=64" and searches.not_shown == 3


def test_labels_that_differ_in_their_middle_stay_apart() -> None:
    """A Triton drop-in kernel's keys differ in the middle of their labels (``n_cols`` before
    the pointers' dtypes): cut in the middle, five bars read the same."""
    rows = [Speedup(f"rowfuse:add_rmsnorm triton float32 n_cols={n},x_ptr.dtype=float32,"
                    "y_ptr.dtype=float32", 1.5, 2.0) for n in (306, 512, 1024, 4096, 8192)]  # fmt: skip
    fig = figures.speedup_figure(rows)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(set(labels)) == 5 and all(len(label) <= 56 for label in labels), labels
    assert all(
        f"n_cols={n}," in label
        for n, label in zip((306, 512, 1024, 4096, 8192), labels, strict=True)
    )
    short = ["matmul tvm float32 M=64", "matmul tvm float32 M=128"]
    assert figures.shorts(short, 56) == short  # what fits is as it is


def test_labels_told_apart_are_never_fewer_than_cut_in_the_middle() -> None:
    """Windowed on the difference from its nearest label, float32 and float16 of one n_cols
    read the same where short() told them apart (a reviewer's fuzzing found more)."""
    import random

    labels = [f"rowfuse:add_rmsnorm triton {d} n_cols={n},x_ptr.dtype={d},y_ptr.dtype={d}"
              for d in ("float32", "float16") for n in (306, 512)]  # fmt: skip
    rng = random.Random(1)
    cases = [labels] + [["".join(rng.choice("ab=,") for _ in range(rng.randint(1, 70)))
                         for _ in range(rng.randint(1, 6))] for _ in range(500)]  # fmt: skip
    for case in cases:
        for limit in (8, 32, 44, 56):
            told = figures.shorts(case, limit)
            assert all(len(text) <= limit for text in told)
            assert len(set(told)) >= len({figures.short(label, limit) for label in case}), case
