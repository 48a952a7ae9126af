"""What a person sees while a key tunes: phases, counts, best so far, ETA, and never silence."""

from __future__ import annotations

import io
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from backends.base import Budget, Progress, Trial
from tunecache_cli.progress import ProgressPrinter, eta_seconds


class Stamped(io.StringIO):
    """A non-terminal stream that remembers when each line arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.stamps: list[float] = []

    def write(self, text: str) -> int:
        self.stamps.extend(time.monotonic() for _ in range(text.count("\n")))
        return super().write(text)


def test_a_tune_with_a_slow_candidate_is_never_silent(tmp_path: Path) -> None:
    from tests.faulty_backend import FaultyTVM
    from tunecache import key_for
    from tunecache.timing import TimerSettings
    from tuner import TuneOptions, tune

    key = key_for("matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32")
    quick = TimerSettings(warmup=1, min_repeats=3, max_repeats=5, target_s=0.01)
    options = TuneOptions(strategy="exhaustive", backend_ref="tests.faulty_backend:FaultyTVM",
                          workers=1, timer=quick, workdir=tmp_path, run_timeout=4)  # fmt: skip
    stream = Stamped()
    started = time.monotonic()
    with ProgressPrinter("matmul", stream, heartbeat=1.0) as progress:
        tune(key, Budget(trials=14), options, backend=FaultyTVM(), progress=progress)
    stamps = [started, *stream.stamps]
    lines = stream.getvalue().splitlines()
    assert max(b - a for a, b in itertools.pairwise(stamps)) < 2.5, lines
    assert any("(still working)" in line for line in lines)  # the hanging candidate's wait
    phases = [line.split()[2] for line in lines]
    # searching, then re-timing the best few, validating, and the final comparison's timing
    last_timing = len(phases) - 1 - phases[::-1].index("timing")
    assert phases.index("searching") < phases.index("validating") < last_timing
    assert lines[-1].split()[2] == "done" and "validated" in lines[-1]


def test_silence_counts_from_the_commands_start_not_each_phases() -> None:
    """A TVM tune was silent 8.7 s from its start: 3.7 s loading (a phase under 5 s says
    nothing), then the search's printer waited its own 5 s."""
    from tunecache_cli.progress import command_start, command_started, working

    stream = Stamped()
    command_started()
    try:
        started = time.monotonic()
        with working("k", "loading", live=False):
            time.sleep(1.5)  # a quick phase: nothing said
        with ProgressPrinter("k", stream, heartbeat=2.0, since=command_start()) as progress:
            progress.expect(Progress(0, 0, message="searching", phase="search"))
            time.sleep(2.5)
        other = io.StringIO()  # a printer of another key: its own time
        with ProgressPrinter("k2", other, heartbeat=60) as progress:
            progress(Progress(1, 4, 0.5, "measured a batch"))
    finally:
        command_started(False)
    assert stream.stamps, "silent"
    assert stream.stamps[0] - started < 2.0 + 0.8  # the command's 2 s, not the phase's
    assert "(still working)" in stream.getvalue()
    # The time it shows is the command's too: a --tvm tune's first line, after 4 s loading,
    # read "1.5s"
    shown = float(stream.getvalue().split("s k ")[0])
    assert shown >= 1.9, stream.getvalue()
    assert float(other.getvalue().split("s k2 ")[0]) < 0.5, other.getvalue()


def test_each_line_says_phase_count_best_and_eta() -> None:
    stream = Stamped()
    with ProgressPrinter("k", stream, heartbeat=60) as progress:
        progress(Progress(4, 16, 0.5, "measured a batch"))
        progress(Progress(8, 16, None, "measured a batch"))  # keeps the best so far
        progress(Progress(0, 5, None, "candidate 1 of 5", phase="validate"))
    first, second, third = stream.getvalue().splitlines()
    assert "k searching [4/16] best 0.5 ms ETA" in first
    assert "[8/16] best 0.5 ms" in second
    assert "k validating [0/5]" in third and "best" not in third  # a new phase, no search best
    assert eta_seconds(10.0, 4, 16) == 30.0 and eta_seconds(10.0, 0, 16) is None


def test_the_live_line_on_a_terminal_renders_the_phase() -> None:
    stream = io.StringIO()
    with ProgressPrinter("k", stream, live=True) as progress:
        progress(Progress(3, 10, 0.25, "measured a batch"))
        progress(Progress(0, 0, None, "0.3 ms, validated", phase="done"))
    shown = stream.getvalue()
    assert "k searching" in shown or "k done" in shown
    assert "0.3 ms, validated" in shown  # the last line stays in the scrollback
    assert shown.count("0.3 ms, validated") == 1, shown  # not again in the live line's last frame


def test_the_live_line_keeps_its_count_time_and_eta_beside_a_long_note() -> None:
    """On a 120-column terminal a long note squeezed the count, the time and the ETA to "…"."""
    from rich.console import Console

    stream = io.StringIO()
    printer = ProgressPrinter("matmul[K=128,M=64,N=64] float32 tvm cpu-avx512", stream, live=True)
    with printer as progress:
        progress(Progress(2, 5, None, "re-timing the search's best 5, each at its own pace of "
                                      "calls per sample", phase="time"))  # fmt: skip
        bar, _ = printer._rich
        bar.console.width = 120
        frame = Console(width=120, file=io.StringIO(), legacy_windows=False)
        with frame.capture() as captured:
            frame.print(bar.get_renderable())
    line = captured.get().splitlines()[0]
    assert "2/5" in line and "0:00:00" in line and "ETA" in line, line
    assert "re-timing" in line and len(line) <= 120, line


def test_the_eta_counts_down_while_a_step_is_awaited() -> None:
    """Heartbeats between steps: the pace as of the last step, counted down (it grew with the
    elapsed time: 37 s, then 93 s)."""
    stream = Stamped()
    with ProgressPrinter("k", stream, heartbeat=0.5) as progress:
        time.sleep(0.6)
        progress(Progress(1, 4, 0.5, "measured a batch"))  # ~0.6 s a step: ~1.8 s left
        time.sleep(2.4)  # heartbeats while the next step is awaited
    etas = [int(line.split("ETA ")[1].split("s")[0]) for line in stream.getvalue().splitlines()
            if "ETA " in line]  # fmt: skip
    assert len(etas) >= 3, stream.getvalue()
    assert etas == sorted(etas, reverse=True) and etas[-1] <= 1  # never up; down to zero


def test_a_report_that_says_again_what_the_last_said_is_not_printed() -> None:
    """MetaSchedule's rounds of no new candidate printed five identical lines in 0.2 s (but for
    the elapsed time) when the output is not a terminal."""
    stream = io.StringIO()
    with ProgressPrinter("k", stream, heartbeat=60) as progress:
        for _ in range(5):
            progress(Progress(1, 8, 0.5, "measured a batch", phase="search"))
        progress(Progress(2, 8, 0.4, "measured a batch"))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "[1/8]" in lines[0] and "[2/8]" in lines[1], lines
    # the same report again and again is no sign of life: the heartbeat still speaks
    stream = io.StringIO()
    with ProgressPrinter("k", stream, heartbeat=0.6) as progress:
        for _ in range(12):
            progress(Progress(3, 8, 0.5, "measured a batch"))
            time.sleep(0.2)
    assert "(still working)" in stream.getvalue(), stream.getvalue()


def test_a_report_of_no_new_trial_is_no_step_of_the_eta() -> None:
    """MetaSchedule's rounds of candidates it had measured report the same count: each was taken
    for a step, and the ETA grew at each (133 s, 136 s, ... 146 s) with nothing measured."""
    stream = io.StringIO()
    with ProgressPrinter("k", stream, heartbeat=60) as progress:
        time.sleep(0.3)
        progress(Progress(1, 4, 0.5, "measured a batch"))  # ~0.3 s a step: ~0.9 s left
        for _ in range(3):
            time.sleep(0.2)
            progress(Progress(1, 4, 0.5, "measured a batch"))  # an empty round: no step
    etas = [float(line.split("ETA ")[1].split("s")[0]) for line in stream.getvalue().splitlines()
            if "ETA " in line]  # fmt: skip
    assert len(etas) >= 2 and etas == sorted(etas, reverse=True), stream.getvalue()


def test_no_eta_once_the_countdown_ran_out_before_the_next_step() -> None:
    """A step slower than the pace so far: the demo said "ETA 0s" for 20 s. Past the
    countdown's end the line says no ETA (plain lines) or "ETA -" (the live line), until the next
    step gives a pace again."""
    stream = Stamped()
    with ProgressPrinter("k", stream, heartbeat=0.3) as progress:
        time.sleep(0.3)
        progress(Progress(3, 4, 0.5, "measured a batch"))  # ~0.1 s a step: ~0.1 s left
        time.sleep(1.3)  # heartbeats while the last step runs over
    heartbeats = [line for line in stream.getvalue().splitlines() if "still" in line]
    assert len(heartbeats) >= 2 and all("ETA" not in line for line in heartbeats), heartbeats
    live = io.StringIO()
    with ProgressPrinter("k", live, live=True) as progress:
        time.sleep(0.2)
        progress(Progress(3, 4, 0.5, "measured a batch"))
        time.sleep(1.0)  # the live line refreshes by itself
    assert "ETA -" in live.getvalue().split("ETA 0s")[-1], live.getvalue()[-400:]


def test_no_eta_goes_past_the_seconds_budget() -> None:
    """``tune --seconds 10``, a MetaSchedule batch of 12 s for 1 of 32 trials: the line said
    "ETA 381s" for a run that stopped 7 s later. The pace's ETA is bounded by the budget's end
    (its clock starts at the run's first report, as the tuner's does), on the plain lines and on
    the terminal's live line alike; past it, what runs over has no ETA."""
    stream = Stamped()
    with ProgressPrinter("k", stream, heartbeat=0.4, seconds=3.0) as progress:
        time.sleep(1.5)  # set-up before the tune reports: not the budget's
        progress(Progress(0, 32, None, "with portfolio (32 trials)"))
        time.sleep(0.3)
        progress(Progress(1, 32, 2.4, "measured a batch"))  # the pace: ~9 s left
        time.sleep(3.2)  # past the budget: the search stopped, the validation runs over
    lines = stream.getvalue().splitlines()
    measured = next(line for line in lines if "measured a batch" in line)
    eta = int(measured.split("ETA ")[1].split("s")[0])
    assert 2 <= eta <= 3, lines  # the budget's 3 s from the first report, less 0.3 s
    assert "ETA" not in lines[-1] and "(still working)" in lines[-1], lines
    live = io.StringIO()
    with ProgressPrinter("k", live, live=True, seconds=2.0) as progress:
        time.sleep(0.3)
        progress(Progress(1, 32, 2.4, "measured a batch"))
        time.sleep(0.6)  # the live line refreshes by itself
    shown = [int(e.split("s")[0]) for e in live.getvalue().split("ETA ")[1:] if e[:1].isdigit()]
    assert shown and max(shown) <= 2, live.getvalue()
    unbounded = Stamped()
    with ProgressPrinter("k", unbounded, heartbeat=60) as progress:
        time.sleep(0.3)
        progress(Progress(1, 32, 2.4, "measured a batch"))
    assert int(unbounded.getvalue().split("ETA ")[1].split("s")[0]) >= 8  # the pace alone


def _followed(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    done_at: dict[str, float],
    claimed: float = 0.0,
    live: bool = True,
) -> dict[int, int | None]:
    """``pretune``'s ETA at each second it printed a line (``None``: none), following jobs queued until a worker
    takes them all at ``claimed`` and each done at its ``done_at``, on a terminal (``live``)
    or in a log. The queue is read through the client's ``list_jobs``; the clock is faked, from
    0."""
    import types

    from tunecache_cli import pretune

    clock = [0.0]

    def list_jobs(limit: int, offset: int = 0, key_hash: list[str] | None = None) -> Any:
        def state(t: float) -> str:
            return "done" if clock[0] >= t else "running" if clock[0] >= claimed else "queued"

        listed = {h: t for h, t in done_at.items() if key_hash is None or h in key_hash}
        items = [types.SimpleNamespace(key_hash=h, state=state(t), attempts=int(clock[0] >= claimed))
                 for h, t in listed.items()][offset:]  # fmt: skip
        return types.SimpleNamespace(items=items, count=len(listed))

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    monkeypatch.setattr(pretune, "time", types.SimpleNamespace(monotonic=lambda: clock[0],
                                                               sleep=sleep))  # fmt: skip
    monkeypatch.setattr(sys.stderr, "isatty", lambda: live)
    assert pretune.follow(types.SimpleNamespace(list_jobs=list_jobs), list(done_at), poll=5) == 0
    lines = [
        line
        for line in capsys.readouterr().err.splitlines()
        if line.split()[:1] and line.split()[0][:-1].isdigit()
    ]
    return {int(line.split()[0].rstrip("s")):
            int(line.split("ETA ")[1].rstrip("s")) if "ETA " in line else None
            for line in lines}  # fmt: skip


def test_pretunes_eta_counts_down_while_the_next_job_is_awaited(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pretune`` following jobs: its ETA grew with the elapsed time (32 s → 56 s between two
    jobs done)."""
    etas = _followed(monkeypatch, capsys, {"a": 10.0, "b": 40.0, "c": 50.0})
    assert etas[10] == 20 and etas[25] == 5  # 10 s a job, counted down
    assert etas[35] is None  # ran out before the next job: no count to go by ("ETA 0s" was not)
    assert etas[40] == 20  # the next job: 40 s for two, one left
    etas = _followed(monkeypatch, capsys, {"a": -1.0, "b": 40.0, "c": 50.0})  # "a" done before
    counted = {t: eta for t, eta in etas.items() if eta is not None}
    assert min(counted) == 40 and etas[40] == 40 and etas[45] == 35  # none before this run's first


def test_pretunes_pace_counts_from_when_a_worker_took_the_first_job(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No daemon ran for the first 40 s: the first job done at 60 s made the pace 60 s a job
    ('ETA 60s' for one that took 20 s)."""
    etas = _followed(monkeypatch, capsys, {"a": 60.0, "b": 80.0}, claimed=40.0)
    assert etas[60] == 20 and etas[70] == 10  # 20 s a job since the claim at 40 s


def test_pretune_in_a_log_writes_a_line_when_a_count_changes_or_a_minute_went_by(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Off a terminal, ``pretune`` wrote its line at every poll: 1,800 lines in a CI log for an
    hour's jobs. Now: when a count changes, else once a minute."""
    etas = _followed(monkeypatch, capsys, {"a": 100.0, "b": 400.0}, claimed=50.0, live=False)
    # 0 s and 50 s (no ETA yet), 100 s: the counts changed; 160 .. 340 s: a minute apart, with
    # no ETA (the pace, 50 s a job, ran out at 150 s: it said "ETA 0s" for four minutes); 400 s
    # all done.
    assert sorted(etas) == [0, 50, 100, 160, 220, 280, 340, 400], etas
    assert etas[100] == 50 and [etas[t] for t in (160, 220, 280, 340, 400)] == [None] * 5


def test_a_search_shows_the_space_as_its_total_when_smaller_than_the_budget() -> None:
    from tunecache.space import SearchSpace
    from tuner.search import get_strategy
    from tuner.search.loop import run_search

    space = SearchSpace({"BLOCK": (16, 32, 64), "warps": (2, 4)})
    seen: list[Progress] = []
    run_search(get_strategy("random", space, seed=0),
               lambda batch: [Trial(config=dict(c), status="ok", time_ms=1.0) for c in batch],
               Budget(trials=10**9), progress=seen.append)  # fmt: skip
    assert seen and {p.total for p in seen} == {6} and seen[-1].done == 6


@pytest.mark.slow
def test_tune_torch_is_never_silent_for_long(tmp_path: Path) -> None:
    """Its max-autotune compile said nothing for 43 s."""
    from tests.test_inductor_cache import write_model

    model = write_model(tmp_path / "user")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "tunecache_cli", "tune", "--torch",
                                f"{model}:Model", "--device", "cpu", "--no-upload"], env=env,
                               cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)  # fmt: skip
    assert process.stderr is not None
    stamps = [started, *(time.monotonic() for _ in process.stderr)]
    assert process.wait(timeout=60) == 0
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert max(gaps[1:]) < 8.0, gaps  # a line at least every 5 s, once the command has started
