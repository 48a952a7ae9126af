"""The measurement harness on CPU with candidates that crash, hang, raise and lie."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends import Budget
from tests.faulty_backend import SlowSetUpBackend
from tunecache.errors import TuningError
from tunecache.space import Config, SearchSpace
from tunecache.timing import TimerSettings
from tuner.harness import Harness, HarnessBenchmarker, Task
from tuner.search import get_strategy
from tuner.search.loop import run_search

pytestmark = pytest.mark.slow
FAULTY = "tests.faulty_backend:FaultyBackend"
QUICK = TimerSettings(warmup=1, min_repeats=3, max_repeats=5, target_s=0.01)


def task(backend: str = FAULTY) -> Task:
    return Task(backend=backend, workload="matmul", problem={"M": 16, "N": 16, "K": 16},
                dtype="float32", timer=QUICK)  # fmt: skip


def cfg(mode: str, sleep_ms: float = 0.0) -> Config:
    return Config.of({"mode": mode, "sleep_ms": sleep_ms})


def test_every_failure_kind_is_recorded_and_the_search_goes_on() -> None:
    configs = [
        cfg("ok", 1.0), cfg("segfault"), cfg("hang"), cfg("wrong"), cfg("raise"),
        cfg("build_raise"), cfg("build_segfault"), cfg("ok"),
    ]  # fmt: skip
    with Harness(workers=2, build_timeout=60, run_timeout=3) as harness:
        bench = harness.benchmarker(task())
        trials = bench.evaluate(configs)
        replaced = harness.replaced
        # The pool still works after all that.
        again = bench.evaluate([cfg("ok")])
    status = {Config.of(t.config): t for t in trials}
    assert [t.config for t in trials] == [c.to_json() for c in configs]  # one trial each, in order
    assert status[cfg("segfault")].status == "runtime_error"
    assert "SIGSEGV" in status[cfg("segfault")].error
    assert status[cfg("hang")].status == "timeout"
    assert status[cfg("wrong")].status == "wrong_answer"
    assert "relative error" in status[cfg("wrong")].error
    assert status[cfg("raise")].status == "runtime_error"
    assert "illegal memory access" in status[cfg("raise")].error
    assert status[cfg("build_raise")].status == "compile_error"
    assert status[cfg("build_segfault")].status == "compile_error"
    assert "SIGSEGV" in status[cfg("build_segfault")].error
    # Only correct candidates have a time, so only they can win.
    timed = {Config.of(t.config) for t in trials if t.time_ms is not None}
    assert timed == {cfg("ok"), cfg("ok", 1.0)}
    fastest = min((t for t in trials if t.time_ms is not None), key=lambda t: t.time_ms or 0)
    assert fastest.config == cfg("ok").to_json()
    assert status[cfg("ok", 1.0)].time_ms >= 1.0  # type: ignore[operator]
    assert replaced >= 3  # segfault, hang, build_segfault each cost a worker
    assert [t.status for t in again] == ["ok"]


def test_builds_run_in_parallel_workers() -> None:
    with Harness(workers=2, build_timeout=60, run_timeout=10) as harness:
        pids = {slot.process.pid for slot in harness._slots}
        trials = harness.benchmarker(task()).evaluate(
            [cfg("ok", 0.0), cfg("ok", 1.0), cfg("wrong"), cfg("ok", 0.0)]
        )
    assert len(pids) == 2
    assert [t.status for t in trials] == ["ok", "ok", "wrong_answer", "ok"]


def test_a_broken_task_fails_at_set_up_with_a_reason() -> None:
    with Harness(workers=1) as harness, pytest.raises(TuningError, match="could not set up"):
        harness.benchmarker(task(backend="tests.faulty_backend:NoSuchBackend")).evaluate(
            [cfg("ok")]
        )


def test_real_backend_through_the_harness() -> None:
    tvm = pytest.importorskip("tvm")  # noqa: F841
    from backends import get_backend
    from workloads import get_workload

    space = get_backend("tvm").space(get_workload("matmul"), {"M": 16, "N": 16, "K": 16}, "float32")  # type: ignore[attr-defined]
    configs = list(space.configs())[:3]
    with Harness(workers=2) as harness:
        trials = HarnessBenchmarker(harness, task(backend="tvm")).evaluate(configs)
    assert all(t.status == "ok" and t.time_ms for t in trials)


def test_tuner_finishes_records_each_failure_and_picks_a_correct_winner(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from backends import Budget
    from tests.faulty_backend import FaultyTVM, mode_of
    from tunecache import key_for
    from tuner import TuneOptions, tune

    key = key_for("matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32")
    options = TuneOptions(strategy="exhaustive", backend_ref="tests.faulty_backend:FaultyTVM",
                          workers=2, timer=QUICK, workdir=tmp_path, run_timeout=3)  # fmt: skip
    outcome = tune(key, Budget(trials=14), options, backend=FaultyTVM())
    record = outcome.record
    assert mode_of(record.config) == "ok" and record.validation.passed
    statuses = {t.status for t in record.trials}
    assert {"ok", "wrong_answer", "runtime_error", "timeout", "compile_error"} <= statuses
    assert record.search.strategy == "exhaustive"
    wrong = [t for t in record.trials if t.config.get("fault") == 1]  # "wrong"
    assert wrong and all(t.time_ms is None for t in wrong)


@pytest.mark.parametrize("kind", ["harness", "in_process"])
def test_every_benchmarker_answers_the_same(kind: str) -> None:
    """One contract for every Benchmarker: statuses, timings only for correct answers, and a
    validation that passes a correct config and fails a wrong one."""
    from tuner.harness import InProcessBenchmarker

    configs = [cfg("ok"), cfg("wrong"), cfg("raise"), cfg("build_raise")]
    with Harness(workers=1, build_timeout=60, run_timeout=10) as harness:
        bench = harness.benchmarker(task()) if kind == "harness" else InProcessBenchmarker(task())
        trials = bench.evaluate(configs)
        eager = bench.measure(None)
        passed = bench.validate(cfg("ok").to_json(), [1, 2])
        failed = bench.validate(cfg("wrong").to_json(), [1])
    assert [t.status for t in trials] == ["ok", "wrong_answer", "runtime_error", "compile_error"]
    assert [t.time_ms is not None for t in trials] == [True, False, False, False]
    assert trials[0].times_ms and min(trials[0].times_ms) <= trials[0].time_ms  # type: ignore[operator]
    assert eager.ok and eager.timing is not None and eager.rel_error is not None
    assert passed.passed and len(passed.checks) == 3  # two seeds and the edge problem
    assert not failed.passed


def test_a_candidate_three_times_slower_than_the_best_is_cut_short() -> None:
    """Timed after a fast one, a 1 ms candidate (the fast one takes microseconds) gets one
    sample, not the full timing; re-timed on its own it is timed at length."""
    with Harness(workers=1) as harness:
        bench = harness.benchmarker(task())
        fast, slow = bench.evaluate([cfg("ok"), cfg("ok", 1.0)])
        assert fast.status == slow.status == "ok"
        assert slow.time_ms is not None and fast.time_ms is not None
        assert slow.time_ms > 3 * fast.time_ms
        assert len(set(slow.times_ms)) == 1  # one sample: min, median and max are the same
        again = bench.measure(cfg("ok", 1.0).to_json())  # a re-timing: no cut-off
    assert again.timing is not None and again.timing.repeats >= QUICK.min_repeats
    assert "cut short" not in again.timing.timer


def test_the_cpu_timer_cuts_a_call_slower_than_the_cutoff() -> None:
    import time

    from tunecache.timing import time_cpu

    settings = TimerSettings(warmup=1, min_repeats=10, target_s=1.0, cutoff_ms=2.0)
    timing = time_cpu(lambda: time.sleep(0.005), settings)
    assert timing.repeats == 1 and "cut short: over 2 ms" in timing.timer
    assert timing.median_ms >= 5.0
    quick = time_cpu(lambda: None, settings)
    assert quick.repeats > 1 and "cut short" not in quick.timer


def test_a_ctrl_c_while_a_worker_starts_is_its_parents_to_act_on() -> None:
    """Ctrl-C reaches a terminal's whole process group: a measurement worker still importing
    died of it with a ``KeyboardInterrupt`` traceback of its own (the parent stops its workers
    itself). A worker starts ignoring SIGINT, and the parent's own Ctrl-C still comes."""
    import os
    import signal
    import time

    from tuner.harness.processes import await_ready, start_worker, stop

    slot = start_worker()
    os.kill(slot.process.pid, signal.SIGINT)  # it is still importing
    try:
        await_ready(slot, timeout=120)  # raised 'a measurement worker died at start' before
        assert slot.process.is_alive()
    finally:
        stop([slot])
    with pytest.raises(KeyboardInterrupt):  # not held back here once the worker is started
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)


def test_a_tasks_set_up_is_counted_apart_from_the_search_it_delays() -> None:
    # On an H200 a tune's first batch paid one-time work, and the search, taking that for what
    # every batch costs, stopped at 9 of its 48 trials with 10 s of its 25 unspent. The set-up
    # of the key's first batch is counted apart, and the search goes on.
    slow = task("tests.faulty_backend:SlowSetUpBackend")
    space = SearchSpace({"mode": ("ok",), "sleep_ms": tuple(i / 10 for i in range(10))})
    with Harness(workers=2, build_timeout=60, run_timeout=10) as harness:
        bench = harness.benchmarker(slow)
        log = run_search(get_strategy("random", space, seed=0), bench.evaluate,
                         Budget(trials=8, seconds=10.0), batch_size=bench.parallelism,
                         after=bench.seconds_after_search,
                         set_up=bench.seconds_setting_up)  # fmt: skip
        set_up = harness.setup_s
        bench.evaluate([cfg("ok")])  # set up already: nothing more to count
        again = harness.setup_s
    # the two workers set up at once, not one after the other
    assert SlowSetUpBackend.SET_UP_S <= set_up < 3 * SlowSetUpBackend.SET_UP_S, set_up
    assert again == set_up == bench.seconds_setting_up()
    # with the set-up taken for a batch's cost, the first batch (2 trials in over 3 s)
    # projected the next, and the work after the search, past the 10 s: it stopped there
    assert (len(log), log.stopped_because) == (8, "trials"), [t.status for _, t in log]


def _libraries(pid: int) -> set[str]:
    """The file names of the shared libraries process ``pid`` has mapped."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {Path(line.split()[-1]).name for line in lines if "/" in line}


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
def test_a_compile_process_has_loaded_torch_and_triton_when_it_says_it_is_ready() -> None:
    """Not in its first compile: that is inside a key's first batch, whose pace a time-bounded
    search takes for the next batch's (a farm process's first compile took 1.8-2.3 s against
    0.6-0.7 s for its next ones on a 2-core AMD EPYC). A measurement worker imports what its
    task needs as it sets the task up (counted apart): a TVM worker loads no Triton."""
    pytest.importorskip("triton")
    from tuner.harness.farm import CompileFarm

    farm = CompileFarm(workers=1, timeout=60, start_timeout=180)
    try:
        compiling = _libraries(farm._slots[0].process.pid)
    finally:
        farm.close()
    with Harness(workers=1) as harness:
        measuring = _libraries(harness._slots[0].process.pid)
    for name in ("libtorch_cpu", "libtriton"):
        assert any(lib.startswith(name) for lib in compiling), (name, sorted(compiling))
        assert not any(lib.startswith(name) for lib in measuring), (name, sorted(measuring))


def test_a_module_that_fails_to_import_at_start_is_named_in_the_first_failure() -> None:
    from tuner.harness.messages import Request
    from tuner.harness.processes import await_ready, start_worker, stop

    slot = start_worker(preload=("tests.unimportable",))
    try:
        await_ready(slot, timeout=120)  # it starts all the same
        slot.conn.send(Request(op="compile"))  # no task: refused
        answer = slot.conn.recv()
    finally:
        stop([slot])
    assert answer.status == "compile_error"
    assert "importing tests.unimportable at start failed" in answer.error, answer.error
    assert "this module refuses to be imported" in answer.error, answer.error


def test_workers_that_do_not_all_start_are_all_stopped() -> None:
    import multiprocessing

    from tuner.harness.farm import CompileFarm

    before = set(multiprocessing.active_children())
    with pytest.raises(TuningError, match="did not start"):
        CompileFarm(workers=2, timeout=60, start_timeout=0.01)  # importing torch takes longer
    # the second process was left running, unowned (in a daemon, one more each time)
    assert set(multiprocessing.active_children()) - before == set()


def test_a_tunes_seconds_count_the_start_of_its_workers(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # --seconds bound the whole tune; the search counted its seconds from its own start, so a
    # slow start of the workers (a compile farm's processes import torch and Triton before they
    # say they are ready) was time the search did not see, and the tune overran by as much.
    import sys
    import time

    from tests.faulty_backend import SoundTVM
    from tunecache import key_for
    from tuner import TuneOptions, tune

    class SlowStart(Harness):
        def __init__(self, **kwargs: object) -> None:
            time.sleep(3.0)
            super().__init__(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sys.modules["tuner.tune"], "Harness", SlowStart)
    key = key_for("matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32")
    options = TuneOptions(strategy="random", backend_ref="tests.faulty_backend:SoundTVM",
                          workers=2, timer=QUICK, workdir=tmp_path)  # fmt: skip
    said: list[str] = []
    outcome = tune(key, Budget(trials=64, seconds=3.0), options, backend=SoundTVM(),
                   progress=lambda p: said.append(p.message))  # fmt: skip
    [searched] = [m for m in said if m.startswith("searched ")]
    # the budget was spent when the search began: its first batch (one config a worker) only
    assert searched.startswith("searched 2 configs (seconds)"), searched
    assert outcome.record.validation.passed
