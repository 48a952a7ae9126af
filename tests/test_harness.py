"""The measurement harness on CPU with candidates that crash, hang, raise and lie."""

from __future__ import annotations

import pytest

from tunecache.errors import TuningError
from tunecache.space import Config
from tunecache.timing import TimerSettings
from tuner.harness import Harness, Job

pytestmark = pytest.mark.slow
FAULTY = "tests.faulty_backend:FaultyBackend"
QUICK = TimerSettings(warmup=1, min_repeats=3, max_repeats=5, target_s=0.01)


def job(backend: str = FAULTY) -> Job:
    return Job(backend=backend, workload="matmul", problem={"M": 16, "N": 16, "K": 16},
               dtype="float32", timer=QUICK)  # fmt: skip


def cfg(mode: str, sleep_ms: float = 0.0) -> Config:
    return Config.of({"mode": mode, "sleep_ms": sleep_ms})


def test_every_failure_kind_is_recorded_and_the_search_goes_on() -> None:
    configs = [
        cfg("ok", 1.0), cfg("segfault"), cfg("hang"), cfg("wrong"), cfg("raise"),
        cfg("build_raise"), cfg("build_segfault"), cfg("ok"),
    ]  # fmt: skip
    with Harness(job(), workers=2, build_timeout=60, run_timeout=3) as harness:
        trials = harness.evaluate(configs)
        replaced = harness.replaced
        # The pool still works after all that.
        again = harness.evaluate([cfg("ok")])
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
    with Harness(job(), workers=2, build_timeout=60, run_timeout=10) as harness:
        pids = {slot.process.pid for slot in harness._slots}
        trials = harness.evaluate([cfg("ok", 0.0), cfg("ok", 1.0), cfg("wrong"), cfg("ok", 0.0)])
    assert len(pids) == 2
    assert [t.status for t in trials] == ["ok", "ok", "wrong_answer", "ok"]


def test_a_broken_job_fails_at_start_with_a_reason() -> None:
    with pytest.raises(TuningError, match="could not set up"):
        Harness(job(backend="tests.faulty_backend:NoSuchBackend"), workers=1)


def test_real_backend_through_the_harness() -> None:
    tvm = pytest.importorskip("tvm")  # noqa: F841
    from backends import get_backend
    from workloads import get_workload

    space = get_backend("tvm").space(get_workload("matmul"), {"M": 16, "N": 16, "K": 16}, "float32")  # type: ignore[attr-defined]
    configs = list(space.configs())[:3]
    with Harness(job(backend="tvm"), workers=2) as harness:
        trials = harness.evaluate(configs)
    assert all(t.status == "ok" and t.time_ms for t in trials)


def test_tuner_finishes_records_each_failure_and_picks_a_correct_winner(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from backends import Budget
    from tests.faulty_backend import FaultyTVM
    from tuner import tune

    outcome = tune(
        "matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32", Budget(trials=14),
        strategy="exhaustive", backend=FaultyTVM(), backend_ref="tests.faulty_backend:FaultyTVM",
        workers=2, timer=QUICK, workdir=tmp_path, run_timeout=3,
    )  # fmt: skip
    record = outcome.record
    assert record.config["mode"] == "ok" and record.validation.passed
    statuses = {t.status for t in record.trials}
    assert {"ok", "wrong_answer", "runtime_error", "timeout", "compile_error"} <= statuses
    assert record.search.strategy == "exhaustive"
    wrong = [t for t in record.trials if t.config.get("mode") == "wrong"]
    assert wrong and all(t.time_ms is None for t in wrong)
