"""What a Triton record's timing says measured it: an interpreted run's times are the host's,
whichever ``do_bench`` produced them, and a ``do_bench`` answer of one number is a median with
no spread, never shown as a p20/p80 that was not measured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cache_server.dashboard.templating import spread
from tests.conftest import LiveServer
from tunecache.client import Client
from tunecache.measured import INTERPRETER_TIMER
from tunecache.triton.record import DO_BENCH_TIMER, timing_of

REPO = Path(__file__).resolve().parent.parent
SCRIPT = """
import torch
import tests.user_triton_timer_labels as m
x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
assert torch.allclose(m.launch(x), x + 3), "wrong result"
assert len(m.BENCH_CALLS) == 3, m.BENCH_CALLS
"""


def test_a_single_number_from_do_bench_is_a_median_without_percentiles() -> None:
    single = timing_of(1.782)
    assert single is not None
    assert single.median_ms == single.min_ms == single.max_ms == 1.782
    assert "p20" not in single.timer and "median" in single.timer and not single.interpreted
    assert "p20" not in spread(single) and spread(single) == "min 1.782 · max 1.782"
    # Three values are do_bench's median, p20 and p80, labelled as such.
    three = timing_of((0.25, 0.2375, 0.28125))
    assert three is not None and three.timer == DO_BENCH_TIMER
    assert spread(three) == "p20 0.2375 · p80 0.2812"


def test_a_wide_range_of_percentiles_is_a_noisy_timing() -> None:
    """A drop-in's record stored no spread (``iqr_ms`` 0) beside p20 and p80, so the noise
    check never saw one: the interpreter's 24.2-56.3 ms around 35.5 ms was a quiet timing."""
    wide = timing_of((35.5, 24.2, 56.3), INTERPRETER_TIMER)
    assert wide is not None and wide.iqr_ms == pytest.approx(56.3 - 24.2)
    assert any("spread 90% of the median" in why for why in wide.figures_noise(cuda=False))
    narrow = timing_of((0.25, 0.249, 0.251))
    assert narrow is not None and narrow.figures_noise(cuda=True) == []


@pytest.mark.slow
def test_an_interpreted_run_with_the_users_do_bench_is_marked_interpreter(
    server: LiveServer,
) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=300, cwd=REPO,
                          env={**os.environ, "TRITON_INTERPRET": "1",
                               "TUNECACHE_URL": server.url})  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Client(server.url) as client:
        records = client.list_records(kernel="tests.user_triton_timer_labels:shift")
    assert records.count == 1
    (record,) = records.items
    assert record.config["BLOCK"] == 64  # the bench's pick: its third config, 1.0 ms
    timing = record.timing
    assert timing.timer == INTERPRETER_TIMER and timing.interpreted
    assert timing.median_ms == timing.min_ms == timing.max_ms == 1.0  # one number: no spread
    assert "p20" not in spread(timing)
    (baseline,) = record.baselines  # the first config, timed by the same bench
    assert baseline.timing.interpreted and baseline.timing.median_ms == 3.0
