"""Noise detected and carried: conditions read, noisy timings taken again, flagged, stored, shown.

Real parts: the CPU timer under real load (busy processes this test starts), a real server for
what is stored and shown; a synthetic benchmarker only where the selection rule is the thing
under test (its interface is the boundary).
"""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends import SearchResult
from bench.timing_noise import busy
from tests.conftest import LiveServer
from tests.dashboard_browser import visit
from tests.factories import make_key, make_record
from tests.test_interleave import NoisyMachine, SyntheticBench
from tunecache import conditions, key_for
from tunecache.client import Client
from tunecache.key import Key
from tunecache.schemas import BaselineModel, ConditionsModel, RecordCreate, Speedup, TimingModel
from tunecache.timing import TimerSettings, conditions_text, time_cpu
from tuner.select import select_winner

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def two_busy_processes() -> Iterator[None]:
    with busy(2):  # the timing bench's own load: two spinning processes
        yield


def noisy_timing(ms: float, *reasons: str) -> TimingModel:
    return TimingModel(median_ms=ms, min_ms=ms, max_ms=ms * 1.5, iqr_ms=ms * 0.3, repeats=20,
                       noisy=bool(reasons), conditions=ConditionsModel(
                           others_cpu=1.9, cpu_mhz_before=2600.0, cpu_mhz_after=2600.0,
                           left_out=7, attempts=2, noise=list(reasons)))  # fmt: skip


def test_each_condition_past_its_threshold_is_named_and_none_below() -> None:
    quiet = conditions.Reading(0.1, (2600.0, 2610.0), None, (), None)
    assert conditions.noise(quiet, spread=0.02, disturbed=0.1, cuda=False) == []
    assert conditions.noise(None, spread=0.02, disturbed=0.0, cuda=False) == []
    busy = conditions.Reading(1.9, (2600.0, 1800.0), (1980.0, 1410.0), ("hw_thermal",), 2)
    why = conditions.noise(busy, spread=0.3, disturbed=0.8, cuda=False)
    assert why == ["spread 30% of the median", "80% of samples disturbed",
                   "other processes used 1.9 cores", "CPU clock 2600->1800 MHz",
                   "GPU clock 1980->1410 MHz", "GPU throttled: hw_thermal",
                   "2 other processes on the GPU"]  # fmt: skip
    # On a GPU, other processes' CPU use and the CPU clock do not disturb CUDA events.
    on_gpu = conditions.noise(conditions.Reading(1.9, (2600.0, 1800.0), (1980.0, 1980.0), (), 0),
                              spread=0.01, disturbed=0.0, cuda=True)  # fmt: skip
    assert on_gpu == []


def test_the_machine_is_read_before_and_after() -> None:
    before = conditions.snapshot()
    time.sleep(conditions.MIN_WALL_S * 2)  # a window long enough to read load over
    reading = conditions.between(before, conditions.snapshot())
    if sys.platform.startswith("linux"):
        assert reading.others_cpu is not None and reading.others_cpu >= 0
    # Nothing on a GPU was asked for.
    assert reading.gpu_clock_mhz is None and reading.gpu_others is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_search_s_own_compile_pool_is_not_another_process() -> None:
    """Inductor compiles in a pool of its own: over a search, this process's descendants are its
    own work (``family``), while a timing counts every other process (the spinning child is
    another process to a timer, one of its own to the search's warning)."""
    # Each reading is compared with the plain one over the same window, not with zero: another
    # process on a busy machine (a bench beside the suite) is "others" to both.
    before, before_family = conditions.snapshot(), conditions.snapshot(family=True)
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 0.6\n"
                              "while time.time() < end: pass"])  # fmt: skip
    time.sleep(0.3)  # the child is alive and spinning: its time is read from /proc
    mid, mid_family = conditions.snapshot(), conditions.snapshot(family=True)
    child.wait(timeout=30)
    plain = conditions.between(before, conditions.snapshot())
    family = conditions.between(before_family, conditions.snapshot(family=True))
    alive_plain = conditions.between(before, mid)
    alive = conditions.between(before_family, mid_family)
    assert plain.others_cpu is not None and plain.others_cpu > 0.4
    assert family.others_cpu is not None and family.others_cpu < plain.others_cpu - 0.3
    assert alive_plain.others_cpu is not None and alive.others_cpu is not None
    assert alive.others_cpu < alive_plain.others_cpu - 0.3  # living, and still its own


def test_a_timing_under_real_load_is_flagged_with_its_conditions(two_busy_processes: None) -> None:
    timing = time_cpu(lambda: sum(range(20_000)), TimerSettings(target_s=0.2))
    assert timing.conditions is not None
    assert timing.noisy and any("other processes used" in why for why in timing.conditions.noise)
    assert (timing.conditions.others_cpu or 0) > conditions.NOISY_OTHERS
    assert "other processes used" in conditions_text(timing.conditions)


def test_what_a_server_says_about_noise_cannot_drive_a_terminal() -> None:
    for bad in (
        {"noise": ["\x1b]0;pwned\x07"]},
        {"noise": [""]},
        {"noise": ["a\nb"]},
        {"throttle": ["\x1b[2J"]},
        {"others_cpu": float("nan")},
        {"attempts": 0},
    ):
        with pytest.raises(ValueError):
            ConditionsModel.model_validate(bad)
    with pytest.raises(ValueError):  # noisy for no reason shown
        TimingModel.model_validate(
            {
                "median_ms": 1.0,
                "min_ms": 1.0,
                "max_ms": 1.0,
                "repeats": 1,
                "noisy": True,
                "conditions": {"noise": []},
            }
        )


def test_a_noisy_timing_needs_its_reasons_and_round_trips() -> None:
    with pytest.raises(ValueError, match="noisy exactly when"):
        TimingModel(median_ms=1.0, min_ms=1.0, max_ms=1.0, repeats=1, noisy=True)
    with pytest.raises(ValueError, match="noisy exactly when"):
        noisy_timing(1.0, "x").model_copy(update={"noisy": False}).model_validate(
            {**noisy_timing(1.0, "x").model_dump(), "noisy": False}
        )
    timing = noisy_timing(1.0, "other processes used 1.9 cores")
    assert TimingModel.model_validate_json(timing.model_dump_json()) == timing


def test_a_measurement_that_stays_noisy_is_timed_again_then_kept_flagged() -> None:
    from tuner.harness.measurer import MAX_ATTEMPTS, Measurer
    from tuner.harness.task import Task

    task = Task(backend="tvm", workload="softmax", problem={"M": 4, "N": 8}, dtype="float32",
                device="cpu", timer_ref="tests.test_noise:always_noisy")  # fmt: skip
    measurer = Measurer(task)
    calls.clear()
    timing = measurer.time(NOTHING, again=True)
    assert len(calls) == MAX_ATTEMPTS and timing.noisy
    assert timing.conditions is not None and timing.conditions.attempts == MAX_ATTEMPTS
    assert timing.conditions.noise == ["spread 30% of the median"]  # the least noisy kept
    calls.clear()
    measurer.time(NOTHING, cutoff_ms=5.0, again=True)  # cut short: never again
    assert len(calls) == 1
    calls.clear()
    measurer.time(NOTHING)  # one round of an interleaved comparison: never again
    assert len(calls) == 1


calls: list[int] = []
NOTHING: Any = print  # a runnable the timer never calls (its timer is always_noisy)


def always_noisy(fn: object, settings: TimerSettings) -> TimingModel:
    """A timer whose every timing is noisy, the second less so than the first."""
    calls.append(1)
    reasons = ["spread 30% of the median"]
    if len(calls) == 1:
        reasons.append("other processes used 1.9 cores")
    return noisy_timing(1.0, *reasons)


def test_a_comparison_with_too_few_undisturbed_rounds_flags_the_winner() -> None:
    machine = NoisyMachine([1.0, 2.0, 3.0], seed=5, busy=1e-9)
    bench = SyntheticBench(machine)
    found = SearchResult(ranked=[{"c": 0}], trials=[])
    steady = select_winner(bench, found, default={"c": 1}, seeds=[1], emit=lambda *a, **k: None)
    assert not steady.timing.noisy
    machine = NoisyMachine([1.0, 2.0, 3.0], seed=5, busy=0.6, burst_ms=1.0)  # bursts, often
    wild = select_winner(SyntheticBench(machine), found, default={"c": 1}, seeds=[1],
                         emit=lambda *a, **k: None)  # fmt: skip
    assert wild.timing.noisy and wild.timing.conditions is not None
    assert any("alternating rounds undisturbed" in why for why in wild.timing.conditions.noise)


def cli(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunecache_cli", *args, "--server", server.url],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=dict(os.environ))  # fmt: skip


def noisy_and_slower_record(key: Key | None = None) -> RecordCreate:
    """A record timed on a busy machine whose winner ran slower than torch eager."""
    key = key or make_key()
    record = make_record(key, time_ms=2.0)
    eager = BaselineModel(name="torch_eager", timing=noisy_timing(1.0),
                          speedup=Speedup(median=0.5, low=0.45, high=0.55, rounds=5))  # fmt: skip
    return record.model_copy(
        update={"timing": noisy_timing(2.0, "other processes used 1.9 cores"), "baselines": [eager]}
    )


def test_the_noisy_flag_and_conditions_are_stored_and_shown(server: LiveServer) -> None:
    record = noisy_and_slower_record()
    assert record.noisy and record.slower_than_eager
    with Client(server.url) as client:
        stored = client.get_record(client.upload(record).record_id)
    assert stored.noisy and stored.timing.conditions == record.timing.conditions
    # What its measurer said first, then what its figures say and it did not (the baseline's
    # timing says nothing of noise: its spread and the other processes' cores do).
    assert stored.noise() == ["winner: other processes used 1.9 cores",
                              "winner: spread 30% of the median",
                              "torch_eager: spread 30% of the median",
                              "torch_eager: other processes used 1.9 cores"]  # fmt: skip

    shown = cli(server, "records", "show", str(stored.id))
    assert shown.returncode == 0, shown.stderr
    assert "noisy: winner: other processes used 1.9 cores" in shown.stdout
    assert "machine    other processes used 1.90 cores" in shown.stdout
    assert "2.00x slower than torch eager (1.82-2.22x)" in shown.stdout
    listed = cli(server, "records", "ls")
    assert "noisy" in listed.stdout.splitlines()[2]

    page = httpx.get(f"{server.url}/ui/records/{stored.id}").text
    index = httpx.get(f"{server.url}/").text
    for text in (page, index):
        assert 'class="badge bad noisy"' in text and 'class="badge bad slower"' in text
    assert "other processes used 1.90 cores" in page


def test_best_counts_torch_eager_as_a_contender(server: LiveServer) -> None:
    key = key_for("matmul", "tvm", {"M": 64, "N": 48, "K": 32}, "float32")
    record = noisy_and_slower_record(key)
    with Client(server.url) as client:
        client.upload(record)
    shape = ",".join(f"{k}={v}" for k, v in key.problem.items())
    shown = cli(server, "best", key.kernel, "--shape", shape, "--backends", key.backend)
    assert shown.returncode == 0, shown.stderr
    first = shown.stdout.splitlines()[0]
    assert "fastest is torch eager (1 ms): no tuned record beats it" in first
    assert "2.00x slower than torch eager (1.82-2.22x)" in first
    assert "(slower than eager)" in shown.stdout and "torch eager" in shown.stdout.splitlines()[-2]
    as_json = json.loads(cli(server, "best", key.kernel, "--shape", shape, "--backends",
                             key.backend, "--json").stdout)  # fmt: skip
    assert as_json["eager_faster"] is True and as_json["eager_ms"] == 1.0
    assert as_json["answers"][0]["slower_than_eager"] and as_json["answers"][0]["noisy"]


def test_chromium_shows_the_noisy_mark_and_the_intervals(
    server: LiveServer,
    chromium: str,
    artifacts: Path,
) -> None:
    record = noisy_and_slower_record()
    with Client(server.url) as client:
        record_id = client.upload(record).record_id
    for name, path in (("index", "/"), ("record", f"/ui/records/{record_id}")):
        seen = visit(chromium, f"{server.url}{path}", artifacts, f"dashboard-noisy-{name}")
        for text in ("noisy", "slower than eager", "2.00× slower (1.82-2.22×)"):
            assert text in seen.dom, (name, text)
        assert seen.console == []
    assert "The machine disturbed these timings" in seen.dom


def test_the_timer_says_how_many_calls_a_sample_is() -> None:
    """One call a sample (a call over ``min_sample_s``) reads "x 1 call", not "x 1 calls"."""
    quick = TimerSettings(warmup=0, min_repeats=3, max_repeats=3, target_s=0.01)
    slow = time_cpu(lambda: time.sleep(0.003), quick)
    assert slow.timer.endswith(" x 1 call"), slow.timer
    fast = time_cpu(lambda: None, quick)
    assert fast.timer.endswith(" calls") and " x 1 call" not in fast.timer, fast.timer


def test_the_conditions_line_counts_one_as_one() -> None:
    """``records show`` said "1 samples left out" (a newcomer's walk)."""
    one = ConditionsModel(others_cpu=0.1, left_out=1, gpu_others=1)
    assert "1 sample left out (disturbed)" in conditions_text(one)
    assert "1 other process on the GPU" in conditions_text(one)
    two = ConditionsModel(others_cpu=0.1, left_out=2, gpu_others=2)
    assert "2 samples left out" in conditions_text(two)
    assert "2 other processes on the GPU" in conditions_text(two)


def test_a_noisy_baseline_is_not_said_to_be_the_records_time(server: LiveServer) -> None:
    """The dashboard's index put a "noisy" badge on a record's time whose own timing was quiet
    (only torch eager's was noisy), and its page said the machine disturbed the timings "even
    when timed again", of timings taken once."""
    key = key_for("matmul", "tvm", {"M": 72, "N": 48, "K": 32}, "float32")
    eager = BaselineModel(name="torch_eager", timing=noisy_timing(1.0, "other processes used 1.4 cores"),
                          speedup=Speedup(median=0.5, low=0.45, high=0.55, rounds=5))  # fmt: skip
    record = make_record(key, time_ms=2.0).model_copy(update={"baselines": [eager]})
    assert record.noisy and not record.time_noisy
    with Client(server.url) as client:
        stored = client.upload(record).record_id
    page = html.unescape(httpx.get(f"{server.url}/ui/records/{stored}", timeout=30).text)
    assert "The machine disturbed the baselines' timings (not the record's own)" in page, page
    assert "timed again" not in page and ">noisy baseline<" in page
    index = httpx.get(f"{server.url}/", timeout=30).text
    assert ">noisy baseline</span>" in index and ">noisy</span>" not in index
    listed = cli(server, "records", "ls")
    assert "noisy baseline" in listed.stdout.splitlines()[2], listed.stdout
    best = cli(server, "best", "matmul", "--shape", "M=72,N=48,K=32", "--backends", "tvm")
    assert "(noisy baseline)" in best.stdout and "(noisy)" not in best.stdout, best.stdout
