"""bench/window_drift.py: its pair counting, and a small real run through a measurement worker."""

from __future__ import annotations

import pytest

from bench import window_drift
from bench.window_drift import Window
from tunecache.interleave import Ratio


def test_pairs_are_counted_within_and_across_processes() -> None:
    narrow, wide, far = Ratio(1.0, 0.99, 1.01, 5), Ratio(1.2, 0.9, 1.5, 5), Ratio(2.0, 1.9, 2.1, 5)
    windows = [Window(0, narrow), Window(0, wide), Window(1, far)]
    # in process 0: wide holds narrow's 1.0, narrow misses wide's 1.2; across: nothing holds
    assert window_drift.holds(windows) == ((1, 2), (0, 4))
    assert window_drift.holds([Window(0, narrow)]) == ((0, 0), (0, 0))


@pytest.mark.slow
def test_a_small_run_times_every_window(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--keys", "softmax/tvm", "--processes", "1", "--windows", "2", "--rounds", "2",
            "--gap", "0", "--no-write"]  # fmt: skip
    assert window_drift.main(argv) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("softmax/tvm"))
    ratios = row.split()[1:3]
    assert all(float(r) > 0 for r in ratios)  # the default's time over eager's, per window
    assert "of 2 pairs in one process, 0 of 0 across processes" in out
