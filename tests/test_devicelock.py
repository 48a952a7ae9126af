"""Timings take turns on a device across processes (:mod:`tunecache.devicelock`): real processes
holding real ``flock`` locks, the real CPU timer, a real MetaSchedule runner."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tunecache import devicelock
from tunecache.schemas import TimingModel
from tunecache.settings import LOCK_WARNED
from tunecache.timing import TimerSettings, time_cpu, time_cuda

REPO = Path(__file__).resolve().parent.parent
QUICK = TimerSettings(warmup=1, min_repeats=5, max_repeats=20, target_s=0.02)
# Holds the device named in argv[1] (pinned to the cores in argv[2], if given) until its stdin
# closes; says when it holds it and when it let go.
HOLDER = """
import os, sys
if len(sys.argv) > 2:
    os.sched_setaffinity(0, {int(c) for c in sys.argv[2].split(",")})
from tunecache.devicelock import timing_on
with timing_on(sys.argv[1]) as turn:
    print("held", turn.shared, flush=True)
    sys.stdin.read()
print("released", flush=True)
"""


@pytest.fixture
def locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lock folder of this test's, and this process's lock state fresh."""
    folder = tmp_path / "locks"
    monkeypatch.setenv("TUNECACHE_LOCK_DIR", str(folder))
    monkeypatch.setattr(devicelock, "_state", devicelock._State())
    monkeypatch.delenv(LOCK_WARNED, raising=False)  # restored after: a warning sets it
    return folder


@pytest.fixture
def holder(locks: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the CPU (every core this one may use) until it is let go."""
    with _hold("cpu") as process:
        yield process


class _hold:
    def __init__(self, device: str, cores: str | None = None) -> None:
        argv = [sys.executable, "-c", HOLDER, device, *([cores] if cores else [])]
        self.process = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)  # fmt: skip

    def __enter__(self) -> subprocess.Popen[str]:
        assert self.process.stdout is not None
        assert self.process.stdout.readline() == "held False\n"
        return self.process

    def __exit__(self, *exc: object) -> None:
        let_go(self.process)


def let_go(process: subprocess.Popen[str]) -> float:
    """Lets the holder go; when it was told to (this machine's clock: it let go after)."""
    told = time.time()
    if process.poll() is None:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.close()
        assert process.stdout.readline() == "released\n"
        process.wait(timeout=30)
    return told


def turn_elsewhere(wait_s: float, cores: set[int] | None = None) -> devicelock.Turn:
    """The turn another process (pinned to ``cores``, if given) gets on the CPU, waiting at
    most ``wait_s``."""
    pin = f"import os; os.sched_setaffinity(0, {sorted(cores)})\n" if cores else ""
    code = (f"{pin}from tunecache import devicelock\ndevicelock.MAX_WAIT_S = {wait_s}\n"
            "with devicelock.timing_on('cpu') as turn: print(turn.waited_s, turn.shared)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    waited, shared = done.stdout.split()
    return devicelock.Turn(float(waited), shared == "True")


@pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU")]),
])  # fmt: skip
def test_a_timing_waits_for_another_processs_timing_on_its_device(locks: Path, device: str) -> None:
    timer = time_cuda if device == "cuda" else time_cpu
    calls: list[float] = []
    timed: list[TimingModel] = []
    with _hold(device) as holder:
        thread = threading.Thread(
            target=lambda: timed.append(timer(lambda: calls.append(time.time()), QUICK))
        )
        thread.start()
        time.sleep(0.5)
        assert calls == [] and thread.is_alive()  # not one call while the other process times
        told = let_go(holder)
    thread.join(timeout=30)
    [timing] = timed
    assert calls and calls[0] >= told  # its warm-up began once the device was free
    assert timing.conditions is not None
    assert not any("lock" in why for why in timing.conditions.noise)


def test_a_lock_held_too_long_is_timed_beside_and_the_timing_says_so(
    holder: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(devicelock, "MAX_WAIT_S", 0.3)
    caplog.set_level(logging.WARNING, "tunecache.devicelock")
    began = time.monotonic()
    timing = time_cpu(lambda: None, QUICK)
    assert time.monotonic() - began < 10
    assert timing.noisy and timing.conditions is not None
    assert "another timing held the device's lock over 0.3 s" in timing.conditions.noise
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) >= 1 and all("held by another process over 0.3 s" in w for w in warned)
    # Waited out: tried, not waited for again, and said once, while it stays held.
    with devicelock.timing_on("cpu") as turn:
        assert turn.shared and turn.waited_s < 0.2
    assert len(caplog.records) == len(warned)
    let_go(holder)
    with devicelock.timing_on("cpu") as turn:  # free again: this process's turn as before
        assert not turn.shared
    after = time_cpu(lambda: None, QUICK)
    assert after.conditions is not None and not any("lock" in w for w in after.conditions.noise)


def test_processes_on_other_cores_do_not_wait_for_each_other(locks: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    first, second = cores[:2]
    with _hold("cpu", str(first)):
        mine = turn_elsewhere(30.0, {second})
        assert mine.waited_s < 1 and not mine.shared
        # The same core is waited for (and, held past the bound here, timed beside).
        both = turn_elsewhere(0.5, {first, second})
        assert both.waited_s >= 0.5 and both.shared


BACK_TO_BACK = """
import sys, time
from tunecache.devicelock import timing_on
print("held False", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    with timing_on("cpu"):
        time.sleep(0.2)  # one candidate's timing, the next one at once (MetaSchedule's loop)
"""


def test_a_process_timing_back_to_back_lets_a_waiting_one_have_its_turn(
    locks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devicelock, "MAX_WAIT_S", 3.0)
    busy = subprocess.Popen([sys.executable, "-c", BACK_TO_BACK, "15"], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert busy.stdout is not None and busy.stdout.readline() == "held False\n"
        time.sleep(0.5)
        for _ in range(4):
            with devicelock.timing_on("cpu") as turn:
                assert not turn.shared and turn.waited_s < 1.5, turn  # a turn or so, not 3 s
                time.sleep(0.1)
    finally:
        busy.kill()
        busy.wait()


class _Interrupted(Exception):
    pass


def test_an_interrupted_wait_lets_go_of_the_cores_it_had(locks: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")

    def interrupt(*_: object) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with _hold("cpu", str(cores[-1])):  # the last core held: the first ones taken, then wait
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            with pytest.raises(_Interrupted), devicelock.timing_on("cpu"):
                pass
            assert not turn_elsewhere(1.0, {cores[0]}).shared  # core 0 is free again
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _Unwind(Exception):
    pass


def test_a_child_forked_inside_a_timing_holds_nothing_and_lets_nothing_go(locks: Path) -> None:
    try:
        with devicelock.timing_on("cpu"):
            pid = os.fork()
            if pid == 0:
                raise _Unwind  # the child leaves the block (its copy of it)
            os.waitpid(pid, 0)
            assert turn_elsewhere(0.5).shared  # still this process's
    except _Unwind:
        os._exit(0)
    assert not turn_elsewhere(0.5).shared


@pytest.mark.parametrize("planted", ["folder", "file", "fifo"])
def test_a_link_or_fifo_is_never_used(
    locks: Path, tmp_path: Path, planted: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A lock folder or file that is a link, or a FIFO (someone else's doing: opening one would
    block), is not used: no file is made where a link points; timings go on without turns, and
    a warning says so once."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    if planted == "folder":
        locks.symlink_to(target, target_is_directory=True)
    else:
        locks.mkdir()
        for core in os.sched_getaffinity(0):
            if planted == "fifo":
                os.mkfifo(locks / f"cpu{core}.lock")
            else:
                (locks / f"cpu{core}.lock").symlink_to(target / f"victim{core}")
    caplog.set_level(logging.WARNING, "tunecache.devicelock")
    for _ in range(2):
        with devicelock.timing_on("cpu") as turn:
            assert not turn.shared
    assert list(target.iterdir()) == []
    assert len(caplog.records) == 1 and "no turns" in caplog.records[0].getMessage()


def test_a_lock_folder_said_unusable_before_a_tune_is_not_said_again_by_its_workers(
    locks: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A tune said "lock folder …: not a plain folder" twice: once from MetaSchedule's runner
    process, once from its own re-timing. Said before the workers start, the processes started
    from here (and forked ones) say it no more."""
    locks.symlink_to(tmp_path, target_is_directory=True)
    caplog.set_level(logging.WARNING, "tunecache.devicelock")
    devicelock.check_folder()
    devicelock.check_folder()
    assert len(caplog.records) == 1 and "no turns" in caplog.records[0].getMessage()
    worker = subprocess.run(
        [sys.executable, "-c", "import logging; logging.basicConfig()\n"
         "from tunecache.devicelock import timing_on\n"
         "with timing_on('cpu') as turn: print('shared', turn.shared)"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert worker.stdout.strip() == "shared False", worker.stderr
    assert "lock folder" not in worker.stderr, worker.stderr
    pid = os.fork()
    if pid == 0:  # a forked worker: nothing said either
        with devicelock.timing_on("cpu"):
            pass
        os._exit(len(caplog.records))
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1  # the parent's one record, no more


@pytest.mark.slow
def test_metaschedules_runner_takes_the_cores_turn(
    holder: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, tmp_path: Path,
) -> None:  # fmt: skip
    """Held past the bound by another process, MetaSchedule's timings are run beside it, and
    that is said: they asked for the turn (its runner is the TVM search's only timer)."""
    pytest.importorskip("tvm")
    from backends import Budget, SearchRequest
    from backends.tvm import TVMBackend
    from workloads import get_workload

    monkeypatch.setattr(devicelock, "MAX_WAIT_S", 0.3)
    caplog.set_level(logging.WARNING, "tunecache.devicelock")
    request = SearchRequest(get_workload("matmul"), {"M": 16, "N": 16, "K": 16}, "float32",
                            Budget(trials=2))  # fmt: skip
    result = TVMBackend().search(request, workdir=tmp_path)
    assert result.config is not None
    assert any("held by another process" in r.getMessage() for r in caplog.records)
