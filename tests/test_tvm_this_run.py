"""A TVM tune reports its own measurements, never times from the local database of earlier runs.

The local database warm-starts the next search, so the best records read back after a search can
be earlier runs'. Here an earlier run is faked: a record of the unscheduled module whose measured
time (1 ns) no real run reaches, committed before the search.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tvm")

from backends import Budget
from backends.tvm.database import normalize_module, open_database
from backends.tvm.search import tune
from tunecache.tvm.target import host_target
from tunecache_cli import main as cli_main

pytestmark = pytest.mark.slow

KERNELS = """
from tvm import te


def rowscale():
    a = te.placeholder((8, 16), name="A", dtype="float32")
    b = te.compute((8, 16), lambda i, j: a[i, j] * 2.0, name="B")
    return te.create_prim_func([a, b])
"""
FAKE_SECONDS = 1e-9  # an "earlier run's" time: 1e-06 ms


def _func(path: Path) -> Any:
    import runpy

    return runpy.run_path(str(path))["rowscale"]()


def _seed_earlier_run(workdir: Path, func: Any) -> None:
    """Commits a record timed at :data:`FAKE_SECONDS` of a schedule no search proposes (a split by
    a constant: MetaSchedule samples its tiles)."""
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms
    from tvm.target import Target

    target = host_target()
    database = open_database(workdir, target)
    mod = normalize_module(func)
    workload = database.commit_workload(mod)
    sch = Schedule(mod)
    sch.split(sch.get_loops(sch.get_sblock("B"))[1], [None, 2])
    record = ms.database.TuningRecord(
        sch.trace, workload, [FAKE_SECONDS], Target(dict(target)),
        ms.arg_info.ArgInfo.from_prim_func(mod["main"]),
    )  # fmt: skip
    database.commit_tuning_record(record)


@pytest.fixture
def kernels(tmp_path: Path) -> Path:
    path = tmp_path / "user_kernels.py"
    path.write_text(KERNELS)
    return path


def test_a_searchs_best_ms_is_its_own_not_an_earlier_runs(kernels: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    func = _func(kernels)
    _seed_earlier_run(workdir, func)
    found = tune(func, host_target(), Budget(trials=4), workdir=workdir, progress=None, cores=1)
    own = [t.time_ms for t in found.trials if t.time_ms is not None]
    assert own and found.best_ms == min(own)


def test_tune_tvm_says_the_best_is_an_earlier_runs_not_in_the_search(
    kernels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    workdir = tmp_path / "work"
    monkeypatch.setenv("TUNECACHE_WORK_DIR", str(workdir))
    _seed_earlier_run(workdir, _func(kernels))
    assert cli_main(["tune", "--tvm", f"{kernels}:rowscale", "--trials", "4", "--no-upload"]) == 0
    out = capsys.readouterr().out
    print(out, file=sys.stderr)
    assert "1e-06 ms" not in out
    assert "in the search" not in out.split("best:")[1].splitlines()[0]
    assert "a schedule from an earlier run's records in the local database" in out
    assert "from earlier runs' records in the local database) match" in out


def test_a_schedule_two_runs_measured_is_one_of_the_best_once(
    kernels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """Each run measures the schedules MetaSchedule proposes again: "validation: 2 of 2 best
    schedules" were one schedule, twice; and "1 measured" against --trials 8 said no more."""
    import json

    from backends.tvm.database import best_records
    from backends.tvm.schedule import trace_json

    workdir = tmp_path / "work"
    monkeypatch.setenv("TUNECACHE_WORK_DIR", str(workdir))
    for _ in range(2):
        assert cli_main(["tune", "--tvm", f"{kernels}:rowscale", "--trials", "64",
                         "--no-upload"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    database = open_database(workdir, host_target())
    mod = normalize_module(_func(kernels))

    def trace(record: Any) -> str:
        return json.dumps(trace_json(record.trace), sort_keys=True)

    every = [trace(r) for r in database.get_top_k(database.commit_workload(mod), 1000)]
    assert len(every) > len(set(every))  # the second run measured a schedule again
    best = [trace(r) for r in best_records(database, mod, 5)]
    assert best and len(best) == len(set(best))
    assert "of 64 asked (MetaSchedule proposed no other new schedule of this module" in out, out
