"""The TVM backend: real MetaSchedule searches and llvm builds on CPU, on tiny shapes."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from backends import Budget, Progress, SearchRequest, SearchResult
from backends.tvm import TVMBackend
from backends.tvm.search import MAX_TRIALS_PER_ITER
from tests.factories import TINY, build_default
from tunecache.errors import InvalidInput, TuningError
from workloads import get_workload
from workloads.base import Workload

DTYPE = "float32"
MATMUL = get_workload("matmul")
SOFTMAX = get_workload("softmax")
MATMUL_PROBLEM = {"M": 32, "N": 48, "K": 64}
SOFTMAX_PROBLEM = {"M": 32, "N": 64}
STATUSES = {"ok", "compile_error", "runtime_error", "timeout"}


def rel_error(workload: Workload, out: Any, inputs: tuple[Any, ...]) -> float:
    ref = workload.reference(*inputs)
    assert tuple(out.shape) == tuple(ref.shape)
    return float((out.double() - ref).norm() / ref.norm())


def assert_correct(
    workload: Workload, runnable: Any, problem: Mapping[str, int], seed: int
) -> None:
    inputs = workload.make_inputs(problem, DTYPE, seed)
    assert rel_error(workload, runnable(*inputs), inputs) <= workload.tolerance(DTYPE)


def roundtrip(config: Mapping[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(config))
    return data


@pytest.fixture(scope="module")
def backend() -> TVMBackend:
    pytest.importorskip("tvm")
    return TVMBackend()


def run_search(
    backend: TVMBackend,
    workload: Workload,
    problem: Mapping[str, int],
    budget: Budget,
    workdir: Path,
) -> tuple[SearchResult, list[Progress]]:
    reports: list[Progress] = []
    request = SearchRequest(workload, problem, DTYPE, budget, progress=reports.append)
    result = backend.search(request, workdir=workdir)
    return result, reports


@pytest.fixture(scope="module")
def matmul_search(
    backend: TVMBackend, tmp_path_factory: pytest.TempPathFactory
) -> tuple[SearchResult, list[Progress], Path]:
    workdir = tmp_path_factory.mktemp("tvm-matmul")
    result, reports = run_search(backend, MATMUL, MATMUL_PROBLEM, Budget(trials=8), workdir)
    return result, reports, workdir


# -- availability (no TVM needed) -------------------------------------------------------------
def test_unavailable_reason_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tvm", None)  # any import of tvm now raises ImportError
    reason = TVMBackend().unavailable_reason()
    assert reason is not None
    assert "pip install 'tunecache[tvm]'" in reason
    assert "\n" not in reason


def test_summarize_default_config() -> None:
    assert TVMBackend().summarize({"schedule": "default"}) == "default (no schedule)"


# -- default configs ---------------------------------------------------------------------------
@pytest.mark.slow
def test_available_here(backend: TVMBackend) -> None:
    assert backend.unavailable_reason() is None
    assert backend.name == "tvm"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TINY))
def test_default_config_builds_and_is_correct(backend: TVMBackend, name: str) -> None:
    workload, problem, runnable = build_default(backend, name)
    assert_correct(workload, runnable, problem, seed=1)
    # A fresh output each call, of the workload's shape.
    inputs = workload.make_inputs(problem, DTYPE, 2)
    first, second = runnable(*inputs), runnable(*inputs)
    assert first.data_ptr() != second.data_ptr()
    assert tuple(first.shape) == workload.output_shape(problem)
    edge = workload.edge_problem(problem)
    assert edge is not None
    assert_correct(workload, backend.build(workload, edge, DTYPE, {"schedule": "default"}), edge, 3)


@pytest.mark.slow
def test_runnable_rejects_wrong_inputs(backend: TVMBackend) -> None:
    problem = TINY["matmul"]
    runnable = backend.build(MATMUL, problem, DTYPE, {"schedule": "default"})
    a, b = MATMUL.make_inputs(problem, DTYPE, 0)
    with pytest.raises((ValueError, TypeError)):
        runnable(a.double(), b)
    with pytest.raises((ValueError, TypeError)):
        runnable(b, a)  # transposed shapes


@pytest.mark.slow
def test_malformed_configs_are_rejected(backend: TVMBackend) -> None:
    problem = TINY["matmul"]
    with pytest.raises(InvalidInput):
        backend.build(MATMUL, problem, DTYPE, {"schedule": "autotvm"})
    with pytest.raises(InvalidInput):
        backend.build(MATMUL, problem, DTYPE, {"schedule": "meta_schedule"})
    bad_trace = [[["GetSBlock", [], ["no_such_block", "main"], ["b0"]]], []]
    with pytest.raises(TuningError, match=r"instruction #0 GetSBlock"):
        backend.build(MATMUL, problem, DTYPE, {"schedule": "meta_schedule", "trace": bad_trace})


# -- search --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_search_reports_every_trial(
    matmul_search: tuple[SearchResult, list[Progress], Path],
) -> None:
    result, reports, _ = matmul_search
    assert result.strategy == "meta_schedule"
    assert 1 <= len(result.trials) <= 8
    assert result.seconds > 0
    for trial in result.trials:
        assert trial.status in STATUSES
        assert (trial.time_ms is not None) == (trial.status == "ok")
        if trial.status == "ok":
            assert trial.time_ms is not None and trial.time_ms > 0
        else:
            assert trial.error and len(trial.error) <= 2000
        assert trial.config["schedule"] == "meta_schedule"
    ok_times = [t.time_ms for t in result.trials if t.time_ms is not None]
    assert ok_times, "no candidate ran"
    # The winner is the fastest measured candidate (a fresh workdir: no earlier records).
    fastest = min(result.trials, key=lambda t: t.time_ms if t.time_ms is not None else 1e30)
    assert fastest.config["trace"] == result.config["trace"]
    # Progress: a start report, one per measured batch, an end report with the trial count.
    assert reports[0].done == 0 and reports[0].total == 8
    assert reports[-1].done == len(result.trials)
    assert reports[-1].best_ms == pytest.approx(min(ok_times))
    assert [p.done for p in reports] == sorted(p.done for p in reports)


@pytest.mark.slow
def test_search_winner_is_correct_and_json(
    backend: TVMBackend, matmul_search: tuple[SearchResult, list[Progress], Path]
) -> None:
    result, _, _ = matmul_search
    runnable = backend.build(MATMUL, MATMUL_PROBLEM, DTYPE, result.config)
    assert_correct(MATMUL, runnable, MATMUL_PROBLEM, seed=5)
    config = roundtrip(result.config)
    assert config == result.config
    assert config["schedule"] == "meta_schedule"
    assert config["target"]["kind"] == "llvm"
    # Rebuilt from JSON alone: at the tuned problem and at an odd-sized edge problem.
    assert_correct(MATMUL, backend.build(MATMUL, MATMUL_PROBLEM, DTYPE, config), MATMUL_PROBLEM, 6)
    edge = MATMUL.edge_problem(MATMUL_PROBLEM)
    assert edge == {"M": 31, "N": 47, "K": 63}
    assert_correct(MATMUL, backend.build(MATMUL, edge, DTYPE, config), edge, seed=7)
    summary = backend.summarize(config)
    assert summary.startswith("tiles ") and len(summary) <= 60


@pytest.mark.slow
def test_search_ranks_other_configs(
    backend: TVMBackend, matmul_search: tuple[SearchResult, list[Progress], Path]
) -> None:
    result, _, _ = matmul_search
    ok = [t for t in result.trials if t.status == "ok"]
    assert len(result.ranked) == min(6, len(ok))
    traces = [json.dumps(c["trace"]) for c in result.ranked]
    assert len(set(traces)) == len(traces)
    times = {json.dumps(t.config["trace"]): t.time_ms for t in ok}
    ranked_times = [times[trace] for trace in traces]
    assert ranked_times == sorted(ranked_times)  # type: ignore[type-var]
    assert_correct(
        MATMUL, backend.build(MATMUL, MATMUL_PROBLEM, DTYPE, result.ranked[1]), MATMUL_PROBLEM, 8
    )


@pytest.mark.slow
def test_search_with_one_seed_proposes_the_same_candidates(
    backend: TVMBackend, matmul_search: tuple[SearchResult, list[Progress], Path], tmp_path: Path
) -> None:
    # A fresh database, the fixture's seed (0) and budget: the same candidates, in the same
    # order (their timings differ; which wins may too). Another seed draws others.
    first, _, _ = matmul_search
    again = backend.search(SearchRequest(MATMUL, MATMUL_PROBLEM, DTYPE, Budget(trials=8)),
                           workdir=tmp_path / "again")  # fmt: skip
    proposed = [json.dumps(t.config["trace"]) for t in first.trials]
    assert [json.dumps(t.config["trace"]) for t in again.trials] == proposed
    other = backend.search(SearchRequest(MATMUL, MATMUL_PROBLEM, DTYPE, Budget(trials=8), seed=1),
                           workdir=tmp_path / "other")  # fmt: skip
    assert [json.dumps(t.config["trace"]) for t in other.trials] != proposed


@pytest.mark.slow
def test_database_is_partitioned_and_warm_starts(
    backend: TVMBackend, matmul_search: tuple[SearchResult, list[Progress], Path]
) -> None:
    from backends.tvm.database import database_dir
    from tunecache.tvm.target import host_target, tvm_version

    first, _, workdir = matmul_search
    partition = database_dir(workdir, host_target())
    assert partition.parent == workdir
    assert partition.name.endswith(f"-tvm{tvm_version()}")
    records = (partition / "database_tuning_record.json").read_text().splitlines()
    assert len(records) == len(first.trials)
    # Re-tuning: the earlier records seed the search, the seconds budget stops it after one
    # candidate (the rest of its batch is skipped, not measured: MetaSchedule still commits them,
    # as failures), and the winner is the fastest record of both runs.
    second, _ = run_search(backend, MATMUL, MATMUL_PROBLEM, Budget(trials=64, seconds=0.1), workdir)
    assert len(second.trials) == 1
    records = (partition / "database_tuning_record.json").read_text().splitlines()
    assert len(first.trials) + 1 <= len(records) <= len(first.trials) + 16
    both = [t for t in [*first.trials, *second.trials] if t.time_ms is not None]
    fastest = min(both, key=lambda t: t.time_ms or 0.0)
    assert second.config["trace"] == fastest.config["trace"]


@pytest.mark.slow
def test_a_deadline_in_the_batch_that_ends_the_trials_stops_the_search(
    backend: TVMBackend, tmp_path: Path
) -> None:
    """The budget's seconds run out in the batch that also proposes the last of its trials:
    MetaSchedule ends the task itself, and it was ended once more from the measure callback,
    failing the tune with TVM's ``Check failed: (!task->is_terminated)``
    (``tune matmul --backend tvm --seconds 4 --trials 16``)."""
    budget = Budget(trials=MAX_TRIALS_PER_ITER, seconds=0.001)
    result, reports = run_search(backend, SOFTMAX, SOFTMAX_PROBLEM, budget, tmp_path)
    assert len(result.trials) == 1 and result.trials[0].status == "ok"  # the rest skipped
    # Said on the last line: "[1/64] meta_schedule: done" said nothing of the 63 not run
    assert result.stopped == "time" and "stopped, the rest of --seconds kept" in reports[-1].message


def test_a_search_leaves_what_follows_it_the_time_it_needs(
    backend: TVMBackend, tmp_path: Path
) -> None:
    """Within ``--seconds`` MetaSchedule stopped at the budget's end, and the re-timing and
    validation after it ran over (``--seconds 10``: 22 s); a batch's 16 builds all ran (10.6 s
    of 10). With ``after`` saying what follows needs more than the time left, it stops after its
    first round of builds and first candidate, whatever the budget; with room, it goes on."""
    asked: list[tuple[float, float]] = []

    def everything(build: float, measure: float) -> float:
        asked.append((build, measure))
        return 1e9

    request = SearchRequest(SOFTMAX, SOFTMAX_PROBLEM, DTYPE, Budget(trials=32, seconds=600),
                            after=everything)  # fmt: skip
    result = backend.search(request, workdir=tmp_path / "tight")
    assert len(result.trials) == 1 and asked and all(build > 0 for build, _ in asked)
    assert result.stopped == "time"
    roomy = dataclasses.replace(request, after=lambda build, measure: 0.0)
    whole = backend.search(roomy, workdir=tmp_path / "roomy")
    assert len(whole.trials) == 32 and whole.stopped == ""


def test_a_round_is_proposed_only_when_it_and_what_follows_the_search_fit() -> None:
    """Within ``--seconds``, MetaSchedule proposed a round (its evolution: 3-5 s a round on a
    2-core CPU) whose builds were then skipped, out of time, and the measurement workers that
    start after the search (each importing TVM) were left out of what follows it: ``tune matmul
    --backend tvm --seconds 20`` took 24 s. Now another round is proposed only when proposing it
    (as long as the last), one round of builds and its timings, and what follows the search fit;
    what follows counts the workers' start as long as the pool's own took."""
    import time

    from backends.tvm.builder import WarmPool

    pool = WarmPool(max_workers=1, timeout_sec=30)
    try:
        waited = time.monotonic() + 120
        while not pool.start_s() and time.monotonic() < waited:  # its worker imports TVM
            time.sleep(0.05)
        start = pool.start_s()
        assert start > 0
        pool.after = lambda build, measure: 1.0
        pool.build_s, pool.measure_s, pool.measured = [0.5], [0.1], 1
        pool.deadline = time.monotonic() + 1.0 + start / 2  # what follows, less half the start
        assert pool.out_of_time()
        pool.deadline = time.monotonic() + 1.0 + start + 3.0  # 3 s to spare
        pool.propose_s = 4.0  # a round: 4.0 + 0.5 + 0.1 s
        assert not pool.out_of_time() and pool.out_of_time(next_round=True)
        pool.propose_s = 1.0  # 1.6 s
        assert not pool.out_of_time(next_round=True)
        pool.workers_follow = False  # a daemon's workers run already: their start is not counted
        pool.deadline = time.monotonic() + 1.0 + start / 2
        assert not pool.out_of_time()
        pool.round_done()  # the runner's end: the cost model's update and proposing follow
        time.sleep(0.3)
        pool.build([])  # a round's builds (an empty round too)
        assert 0.3 <= pool.propose_s < 30
    finally:
        pool.close()


def test_different_targets_get_different_databases(backend: TVMBackend, tmp_path: Path) -> None:
    from backends.tvm.database import database_dir, open_database
    from tunecache.tvm.target import host_target

    mine = host_target()
    other = {**mine, "num-cores": mine["num-cores"] + 1}
    generic = {"kind": "llvm", "num-cores": mine["num-cores"]}
    dirs = {database_dir(tmp_path, t) for t in (mine, other, generic)}
    assert len(dirs) == 3
    assert database_dir(tmp_path, dict(mine)) == database_dir(tmp_path, mine)
    for target in (mine, other):
        open_database(tmp_path, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        database_dir(tmp_path, t).name for t in (mine, other)
    )


def test_a_database_grown_past_its_bound_is_not_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A daemon's partition grows with every job (MetaSchedule reads it whole at each tune): one
    past MAX_DATABASE_BYTES is not read; the tune starts cold in memory, warned."""
    from backends.tvm.database import MAX_DATABASE_BYTES, database_dir, open_database
    from tunecache.tvm.target import host_target

    path = database_dir(tmp_path, host_target())
    path.mkdir(parents=True)
    grown = path / "database_tuning_record.json"
    with grown.open("wb") as f:  # sparse: its size is read, not its bytes
        f.truncate(MAX_DATABASE_BYTES + 1)
    (path / "database_workload.json").write_text("")
    with caplog.at_level(logging.WARNING, logger="backends.tvm.database"):
        database = open_database(tmp_path, host_target())
    assert len(database) == 0 and grown.stat().st_size == MAX_DATABASE_BYTES + 1
    assert [r.getMessage() for r in caplog.records] == [
        f"MetaSchedule database at {path} holds 256 MiB (over 256 MiB): not read, this tune "
        "starts cold and its records are not kept; remove the folder to start a new one"
    ]


@pytest.mark.slow
def test_host_target_uses_the_cpu_name(backend: TVMBackend) -> None:
    from tvm.target import Target, codegen

    from tunecache.tvm.target import host_target

    target = host_target()
    assert target["kind"] == "llvm" and target["num-cores"] >= 1
    if "mcpu" in target:  # then LLVM sees the host's vector extensions
        host = codegen.llvm_get_cpu_features(Target(target))
        generic = codegen.llvm_get_cpu_features(Target({"kind": "llvm"}))
        simd = {f for f in generic if f.startswith(("sse", "avx"))}
        assert simd <= host
        assert {f for f in host if f.startswith(("sse", "avx"))} - simd


@pytest.mark.slow
def test_softmax_search_and_edge_rebuild(backend: TVMBackend, tmp_path: Path) -> None:
    result, _ = run_search(backend, SOFTMAX, SOFTMAX_PROBLEM, Budget(trials=8), tmp_path)
    runnable = backend.build(SOFTMAX, SOFTMAX_PROBLEM, DTYPE, result.config)
    assert_correct(SOFTMAX, runnable, SOFTMAX_PROBLEM, seed=11)
    edge = SOFTMAX.edge_problem(SOFTMAX_PROBLEM)
    assert edge is not None
    # A trace replays on odd sizes, or fails with a TuningError naming the instruction
    # (re-sampled tiles can change a reduction's loop nest); some config among the best does.
    built = 0
    for config in result.ranked:
        try:
            runnable = backend.build(SOFTMAX, edge, DTYPE, roundtrip(config))
        except TuningError as exc:
            assert "instruction #" in str(exc)
            continue
        assert_correct(SOFTMAX, runnable, edge, seed=12)
        built += 1
    assert built >= 1


# -- trial bookkeeping ---------------------------------------------------------------------------
@pytest.mark.slow
def test_trial_statuses_from_results(backend: TVMBackend) -> None:
    from backends.tvm.search import trial_from_results

    config = {"schedule": "meta_schedule", "trace": [[], []]}
    built, not_built = SimpleNamespace(error_msg=None), SimpleNamespace(error_msg="x" * 5000)
    ran = SimpleNamespace(error_msg=None, run_secs=[1e-3, 3e-3])
    ok = trial_from_results(config, built, ran)
    assert ok.status == "ok" and ok.time_ms == pytest.approx(2.0)
    failed = trial_from_results(config, not_built, SimpleNamespace(error_msg="skipped"))
    assert failed.status == "compile_error" and len(failed.error) == 2000
    crashed = trial_from_results(
        config, built, SimpleNamespace(error_msg="segfault", run_secs=None)
    )
    assert crashed.status == "runtime_error" and crashed.error == "segfault"
    slow = trial_from_results(config, built, SimpleNamespace(error_msg="run timed out after 10 s"))
    assert slow.status == "timeout" and slow.time_ms is None


def test_import_failure_says_why() -> None:
    from backends.base import import_failure

    assert import_failure(("json",), "json", "pip install x") is None
    assert import_failure(("no_such_module_xyz",), "xyz", "pip install xyz") == "pip install xyz"


@pytest.mark.slow
def test_a_tunes_working_files_go_where_TUNECACHE_WORK_DIR_says(tmp_path: Path) -> None:
    """MetaSchedule's database (which later tunes start from) and the workers' log went to
    ``~/.cache/tunecache/work`` whatever the environment said."""
    import os
    import subprocess

    from backends.tvm.database import database_dir
    from tunecache.tvm.target import host_target

    work = tmp_path / "work"
    env = {**os.environ, "TUNECACHE_WORK_DIR": str(work)}
    done = subprocess.run([sys.executable, "-m", "tunecache_cli", "tune", "softmax", "--backend",
                           "tvm", "--shape", "M=16,N=32", "--trials", "2", "--no-upload"],
                          capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    partition = database_dir(work, host_target())
    assert (partition / "database_tuning_record.json").read_text().strip()
    assert (work / "workers.log").is_file()
