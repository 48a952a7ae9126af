"""tunecache.tvm.Database: MetaSchedule records shared through a real server, between processes.

Process A is ``tunecache tune --tvm FILE.py:NAME`` (a subprocess) tuning a module this file writes;
process B (``tests/tvm_db_client.py``, a fresh subprocess) compiles the same module with
``compile_tir`` and the team database. Failures of the server (down, silent, garbage, 401) and
hostile records stored through the API must leave ``compile_tir`` working on TVM's default
schedule.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import LiveServer
from tests.factories import hostile_artifacts, store_behind_the_api
from tests.tvm_db_client import seeded_inputs
from tunecache.artifacts import ArtifactIn
from tunecache.client import Client
from tunecache.errors import InvalidInput

tvm = pytest.importorskip("tvm")

from tunecache.tvm import Database, partition_for, workload_key  # noqa: E402
from tunecache.tvm.target import host_target, partition_name  # noqa: E402
from tunecache_cli import main as cli_main  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CLIENT_SCRIPT = REPO / "tests" / "tvm_db_client.py"

KERNELS = '''
"""A user's own TVM kernels (written by tests/test_tvm_database.py)."""
from tvm import te
from tvm.script import tirx as T


def matmul_bias():
    n = 64
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    bias = te.placeholder((n,), name="bias")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    D = te.compute((n, n), lambda i, j: C[i, j] + bias[j], name="D")
    return te.create_prim_func([A, B, bias, D])


@T.prim_func(s_tir=True)
def scale_add(A: T.Buffer((128, 96), "float32"), B: T.Buffer((128, 96), "float32"),
              C: T.Buffer((128, 96), "float32")):
    T.func_attr({"tirx.noalias": True})
    for i, j in T.grid(128, 96):
        with T.sblock("C"):
            vi, vj = T.axis.remap("SS", [i, j])
            C[vi, vj] = A[vi, vj] * T.float32(2) + B[vi, vj]


not_tvm = 42


class Mlp(__import__("torch").nn.Module):  # for tune --torch: called, it raised a TypeError
    def __init__(self, width):
        super().__init__()


def raises():
    raise RuntimeError("no kernel today")
'''


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **extra}


def _normalized(func: Any) -> Any:
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    return _normalize_mod(func)


def _load(path: Path, name: str) -> Any:
    import runpy

    value = runpy.run_path(str(path))[name]
    return value() if callable(value) and not isinstance(value, tvm.tirx.PrimFunc) else value


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("user") / "user_kernels.py"
    path.write_text(KERNELS)
    return path


@pytest.fixture(scope="module")
def tuned(
    shared_server: LiveServer, kernels: Path, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    """Process A: ``tunecache tune --tvm user_kernels.py:matmul_bias --trials 16`` (run once)."""
    cache = tmp_path_factory.mktemp("cache-a")
    done = subprocess.run(
        [sys.executable, "-m", "tunecache_cli", "tune", "--tvm", f"{kernels}:matmul_bias",
         "--trials", "16"],
        capture_output=True, text=True, timeout=300, cwd=kernels.parent,
        env=_env(TUNECACHE_URL=shared_server.url, XDG_CACHE_HOME=str(cache)),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done


def _process_b(url: str, kernels: Path, name: str, tmp: Path) -> tuple[dict[str, Any], Any]:
    """Runs process B in a fresh interpreter with an empty cache; its result and output."""
    out = tmp / f"b-{name}-{time.monotonic_ns()}"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, str(CLIENT_SCRIPT), url, str(kernels), name, str(out)],
        capture_output=True, text=True, timeout=120, cwd=out,
        env=_env(XDG_CACHE_HOME=str(out / "cache")),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads((out / "result.json").read_text()), np.load(out / "out.npy")


def _top_record_value(url: str, mod: Any) -> Any:
    """The best-scored record of ``mod`` on the server, as stored."""
    with Client(url) as client:
        items = client.get_artifacts("tvm.record", partition_for(host_target()),
                                     key=workload_key(mod))  # fmt: skip
    assert items, "no records on the server"
    return items[0].value


def _schedule_of(mod: Any, value: Any) -> Any:
    """``mod`` scheduled by the stored record ``value`` (replayed here, as A's best)."""
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    record = TuningRecord.from_json(value, Workload(mod))
    sch = tvm.s_tir.Schedule(mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod


def _run(mod: Any, shapes: list[tuple[int, ...]]) -> Any:
    lib = tvm.tirx.build(mod, target=tvm.target.Target(host_target()))
    values = [*seeded_inputs(shapes[:-1]), np.full(shapes[-1], np.nan, dtype="float32")]
    tensors = [tvm.runtime.tensor(v) for v in values]
    lib["main"](*tensors)
    return tensors[-1].numpy(), values


MATMUL_SHAPES = [(64, 64), (64, 64), (64,), (64, 64)]


# -- process A → server → process B ----------------------------------------------------------
@pytest.mark.slow
def test_cli_tunes_validates_and_uploads(
    tuned: Any, shared_server: LiveServer, kernels: Path
) -> None:
    report = tuned.stdout
    assert "trials: 16 measured" in report
    assert "validation:" in report and "max rel error" in report
    versus = next(line for line in report.splitlines() if " vs default schedule " in line)
    assert re.search(r"x (faster|slower) \([0-9.]+-[0-9.]+x\)$|the same within noise", versus)
    # its ratio is the rounds' median, not the two medians' shown beside it: said so
    assert re.search(r"ms \(medians, timed in alternating rounds; the speedup is the median of "
                     r"the \d+ rounds' ratios(, \d+ of \d+ left out as disturbed)?\): ",
                     versus), versus  # fmt: skip
    mod = _normalized(_load(kernels, "matmul_bias"))
    with Client(shared_server.url) as client:
        part = partition_for(host_target())
        records = client.get_artifacts("tvm.record", part, key=workload_key(mod))
        workloads = client.get_artifacts("tvm.workload", part, key=workload_key(mod))
    assert 1 <= len(records) <= 5  # only the validated best ones, never all 16
    assert all(r.score is not None and r.score > 0 for r in records)
    assert workloads and workloads[0].value["script_sha"] == workload_key(mod)
    # Its lines count from the command's start, every phase (the clock restarted at each), and
    # the search names its count from its first line ("searching (still working)" for 25 s)
    lines = [line for line in tuned.stderr.splitlines() if re.match(r"^ *[0-9.]+s tvm ", line)]
    stamps = [float(line.split("s tvm ")[0]) for line in lines]
    assert stamps == sorted(stamps), tuned.stderr
    assert all("/16]" in line for line in lines if " searching " in line), tuned.stderr


@pytest.mark.slow
def test_fresh_process_builds_with_team_records_and_no_benchmarks(
    tuned: Any, shared_server: LiveServer, kernels: Path, tmp_path: Path
) -> None:
    result, out = _process_b(shared_server.url, kernels, "matmul_bias", tmp_path)
    assert result["schedule"] == "tuned"
    assert result["benchmarks"] == {}  # nothing tuned, built for measurement or timed
    mod = _normalized(_load(kernels, "matmul_bias"))
    best = _schedule_of(mod, _top_record_value(shared_server.url, mod))
    assert result["script_sha"] == _sha(best.script())  # A's best schedule, not another
    assert result["script_sha"] != _sha(mod.script())  # and not the default one
    expected, values = _run(best, MATMUL_SHAPES)  # A's best on the same inputs
    np.testing.assert_array_equal(out, expected)
    a, b, bias = (v.astype("float64") for v in values[:3])
    np.testing.assert_allclose(out, a @ b + bias, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_without_team_records_a_fresh_process_gets_the_default_schedule(
    server: LiveServer, kernels: Path, tmp_path: Path
) -> None:
    result, out = _process_b(server.url, kernels, "matmul_bias", tmp_path)
    mod = _normalized(_load(kernels, "matmul_bias"))
    assert result["schedule"] == "default"
    assert result["script_sha"] == _sha(mod.script())
    assert result["benchmarks"] == {}
    expected, _ = _run(mod, MATMUL_SHAPES)
    np.testing.assert_allclose(out, expected, rtol=1e-5)


@pytest.mark.slow
def test_lookups_are_memoised(tuned: Any, shared_server: LiveServer, kernels: Path) -> None:
    mod = _normalized(_load(kernels, "matmul_bias"))
    db = Database(shared_server.url, target=host_target())
    requests: list[str] = []
    db.remote.client._http.event_hooks["request"].append(lambda r: requests.append(str(r.url)))
    schedules = [tvm.s_tir.meta_schedule.tir_integration.compile_tir(db, mod, host_target())
                 for _ in range(3)]  # fmt: skip
    assert all(s is not None for s in schedules)
    assert len(requests) == 1
    db.refresh()
    assert tvm.s_tir.meta_schedule.tir_integration.compile_tir(db, mod, host_target()) is not None
    assert len(requests) == 2


# -- the public API: tune_tir writes, another process reads ----------------------------------
@pytest.mark.slow
def test_tune_tir_with_the_database_shares_records(
    shared_server: LiveServer, kernels: Path, tmp_path: Path
) -> None:
    from tvm.s_tir import meta_schedule as ms

    from backends.tvm.builder import WarmPool, make_builder
    from backends.tvm.intrin import cpu_intrinsics_only
    from backends.tvm.runner import make_runner

    func = _load(kernels, "scale_add")  # TVMScript
    target = host_target()
    db = Database(shared_server.url, target=target)
    pool = WarmPool(max_workers=2, timeout_sec=30)
    try:
        with cpu_intrinsics_only():
            ms.tune_tir(func, target, str(tmp_path / "work"), max_trials_global=4,
                        num_trials_per_iter=4, database=db, builder=make_builder(pool),
                        runner=make_runner(pool, repeat=1, min_repeat_ms=1),
                        strategy=ms.search_strategy.EvolutionarySearch(population_size=64))  # fmt: skip
    finally:
        pool.close()
    assert len(db.get_all_tuning_records()) >= 1
    result, out = _process_b(shared_server.url, kernels, "scale_add", tmp_path)
    assert result["schedule"] == "tuned" and result["benchmarks"] == {}
    a, b = seeded_inputs([(128, 96), (128, 96)])
    np.testing.assert_allclose(out, 2 * a + b, rtol=1e-6)
    other = Database(shared_server.url, target=target)  # a new memo: from the server only
    assert len(other) == 0  # it has seen no workload yet
    assert other.has_workload(_normalized(func))
    assert len(other) >= 1 and len(other.get_top_k(other.commit_workload(_normalized(func)), 9))


def test_partition_is_the_backends_partition() -> None:
    target = host_target()
    assert partition_for(target) == partition_name(target)
    assert partition_for(target) != partition_for({**target, "num-cores": 64})
    assert tvm.__version__ in partition_for(target)


def test_importing_tunecache_does_not_import_tvm() -> None:
    code = "import sys, tunecache, tunecache.client; assert 'tvm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- a server that fails ---------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_server() -> Iterator[tuple[str, list[int]]]:
    """A socket that accepts connections and never answers; yields (url, [connections])."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[int] = []
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            accepted.append(1)
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", accepted
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


@pytest.fixture
def garbage_server() -> Iterator[str]:
    """An HTTP server answering every request with 200 and a body that is not the API's JSON."""

    class Garbage(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"items": [{"value": "not a record", "id": -3}], "next_after": "x"'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *args: Any) -> None:
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Garbage)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and r.name.startswith("tunecache")]  # fmt: skip


def _compile_twice_with(db: Database, kernels: Path) -> Any:
    """``compile_tir`` twice (and a tune-time commit) through ``db``; builds what it returns."""
    from tvm.s_tir.meta_schedule import tir_integration

    mod = _normalized(_load(kernels, "matmul_bias"))
    for _ in range(2):
        sch = tir_integration.compile_tir(db, mod, host_target())
        assert sch is None  # nothing usable: TVM's default schedule
    out, _ = _run(mod, MATMUL_SHAPES)
    assert np.isfinite(out).all()
    return out


@pytest.mark.parametrize("bad", [500, True, 0, float("nan"), "1"])
def test_a_timeout_that_is_not_a_lookups_few_seconds_is_refused(bad: Any) -> None:
    """``timeout=500`` (milliseconds meant) held each lookup of a silent server 8 minutes,
    where ``TUNECACHE_TIMEOUT=500`` is refused; ``True`` was one second."""
    with pytest.raises(InvalidInput, match="timeout must be a positive number of seconds, at"):
        Database("http://127.0.0.1:9", target=host_target(), timeout=bad)


def test_server_down_falls_back_with_one_warning(
    kernels: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    db = Database(f"http://127.0.0.1:{_free_port()}", target=host_target(), timeout=0.5)
    _compile_twice_with(db, kernels)
    assert len(db) == 0 and db.get_all_tuning_records() == []
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "Connection refused" in warnings[0], warnings


def test_silent_server_costs_one_timeout(
    kernels: Path, silent_server: tuple[str, list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    url, accepted = silent_server
    db = Database(url, target=host_target(), timeout=0.3)
    started = time.monotonic()
    _compile_twice_with(db, kernels)
    assert len(db) == 0
    assert time.monotonic() - started < 30  # a hang check, not a speed claim
    assert len(accepted) == 1  # one request timed out; nothing was asked after it
    assert len(_warnings(caplog)) == 1


def test_garbage_answers_fall_back_with_one_warning(
    kernels: Path, garbage_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    _compile_twice_with(Database(garbage_server, target=host_target()), kernels)
    assert len(_warnings(caplog)) == 1


def test_a_refused_token_falls_back_with_one_warning(
    server: LiveServer, kernels: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    db = Database(server.url, target=host_target(), token="tc_not-a-token")
    _compile_twice_with(db, kernels)
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "401" in warnings[0], warnings


def test_a_read_only_token_reads_and_keeps_its_records_local(
    server: LiveServer, kernels: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tvm.s_tir.meta_schedule import tir_integration

    caplog.set_level(logging.WARNING)
    target = host_target()
    mod = _normalized(_load(kernels, "matmul_bias"))
    with Client(server.url) as admin:
        admin.put_artifacts([ArtifactIn(namespace="tvm.record", partition=partition_for(target),
                                        key=workload_key(mod), item="team",
                                        value=_hand_record(mod, 0.5, "D", 16).as_json(),
                                        score=0.5)])  # fmt: skip
        reader = admin.create_token("reader", "read").token
    db = Database(server.url, target=target, token=reader)
    mine = _hand_record(mod, 0.1, "D", 8)  # as if tune_tir measured it here, faster
    db.commit_tuning_record(mine)  # refused (403): kept here, one warning
    db.commit_tuning_record(_hand_record(mod, 0.2, "D", 32))  # not even tried
    assert len(db) == 3  # the team's record (read) and both of this process's
    sch = tir_integration.compile_tir(db, mod, target)
    assert sch is not None
    assert _sha(sch.mod.script()) == _sha(_schedule_of(mod, mine.as_json()).script())
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "403" in warnings[0], warnings


# -- hostile records, stored behind the API -----------------------------------------------
def _hand_record(mod: Any, seconds: float, block: str, factor: int) -> Any:
    """A real, valid record of ``mod``: a hand-written schedule, as if measured at ``seconds``."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    sch = tvm.s_tir.Schedule(mod)
    loops = sch.get_loops(sch.get_sblock(block))
    outer, _ = sch.split(loops[0], [None, factor])
    sch.parallel(outer)
    return TuningRecord(sch.trace, Workload(mod), [seconds], tvm.target.Target(host_target()),
                        ArgInfo.from_entry_func(mod, remove_preproc=True))  # fmt: skip


def _hostile_values(mod: Any, other: Any) -> list[Any]:
    good = _hand_record(mod, 0.5, "D", 16).as_json()
    foreign = _hand_record(other, 0.001, "C", 16).as_json()  # another workload's record
    forged = [foreign[0], foreign[1], foreign[2], good[3]]  # ... claiming this one's arguments
    out_of_range = json.loads(json.dumps(good))
    out_of_range[0][1] = [[10_000, [4, 16]]]  # a decision for no instruction (crashes TVM)
    zero_tiles = json.loads(json.dumps(good))
    zero_tiles[0][1] = [[len(good[0][0]) - 1, [0, 0]]]
    return [
        {"garbage": True},
        [1, "x", None, {}],
        ["trace", ["fast"], "llvm", []],
        foreign,
        forged,
        out_of_range,
        zero_tiles,
        [good[0], ["fast"], good[2], good[3]],
        [good[0], [1e10], good[2], good[3]],  # MetaSchedule's marker of a failed run
        [good[0], good[1], {"kind": 7}, good[3]],
    ]


def test_hostile_records_are_ignored(
    server: LiveServer, kernels: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tvm.s_tir.meta_schedule import tir_integration

    caplog.set_level(logging.DEBUG, logger="tunecache")
    target = host_target()
    mod = _normalized(_load(kernels, "matmul_bias"))
    other = _normalized(_load(kernels, "scale_add"))
    part, key = partition_for(target), workload_key(mod)
    values = _hostile_values(mod, other)
    with hostile_artifacts(values) as url:  # a compromised server serves every one of them
        db = Database(url, target=target)
        assert tir_integration.compile_tir(db, mod, target) is None  # nothing usable: default
        assert db.get_top_k(db.commit_workload(mod), 5) == []
        assert len(db) == 0
    rejected = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
    assert len(rejected) >= len(values) - 1

    # Stored behind a real server's API (a compromised database): its reads refuse what the
    # closed schemas refuse, the client the rest (another workload's records).
    hostile = [
        {"namespace": "tvm.record", "partition": part, "key": key, "item": f"h{i}", "value": v,
         "score": 0.0}
        for i, v in enumerate(values)
    ]  # fmt: skip
    hostile.append({"namespace": "tvm.workload", "partition": part, "key": key,
                    "value": {"script_sha": key, "mod": {"root": 1, "nodes": [7]}}})  # fmt: skip
    assert store_behind_the_api(server.db, hostile) == len(hostile)
    db = Database(server.url, target=target)
    assert tir_integration.compile_tir(db, mod, target) is None

    good = _hand_record(mod, 0.5, "D", 16)
    with Client(server.url) as client:
        client.put_artifacts([ArtifactIn(namespace="tvm.record", partition=part, key=key,
                                         item="good", value=good.as_json(), score=0.5)])  # fmt: skip
    fresh = Database(server.url, target=target)
    sch = tir_integration.compile_tir(fresh, mod, target)
    assert sch is not None  # the one good record, after every hostile one scored better
    expected = _schedule_of(mod, good.as_json())
    assert _sha(sch.mod.script()) == _sha(expected.script())
    out, values = _run(sch.mod, MATMUL_SHAPES)
    a, b, bias = (v.astype("float64") for v in values[:3])
    np.testing.assert_allclose(out, a @ b + bias, rtol=1e-4, atol=1e-4)


def _chained_caches(mod: Any, count: int) -> Any:
    """A record of ``mod`` whose trace reads one buffer through ``count`` chained caches: each
    instruction allowed, each replay and the build cubically slower (1,000: 44 s)."""
    sch = tvm.s_tir.Schedule(mod)
    block = sch.get_sblock("D")
    for _ in range(count):
        sch.cache_read(block, 0, "global")
    return sch.trace


def test_a_trace_adding_blocks_without_bound_is_refused_before_replay(kernels: Path) -> None:
    from backends.tvm.schedule import trace_json
    from tunecache.configcheck.tvm import record_value_problem
    from tunecache.configcheck.tvm_trace import MAX_STAGES

    mod = _normalized(_load(kernels, "matmul_bias"))
    good = _hand_record(mod, 0.5, "D", 16).as_json()
    slow = [trace_json(_chained_caches(mod, MAX_STAGES + 1)), [1e-9], good[2], good[3]]
    assert record_value_problem(slow) == (
        f"trace adds {MAX_STAGES + 1} blocks (CacheRead, CacheWrite, RFactor, "
        f"DecomposeReduction), over {MAX_STAGES}"
    )
    bounded = [trace_json(_chained_caches(mod, 4)), [1e-9], good[2], good[3]]
    assert record_value_problem(bounded) is None  # a few caches, as MetaSchedule adds


def test_checking_a_workloads_records_stops_at_its_time_budget(
    kernels: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records that pass every check can still replay slowly: past CHECK_SECONDS of checking one
    workload's, the rest are not used (256 of them checked for minutes)."""
    import tunecache.tvm.database as database

    caplog.set_level(logging.DEBUG, logger="tunecache")
    monkeypatch.setattr(database, "CHECK_SECONDS", 1e-9)  # spent by the first record's check
    mod = _normalized(_load(kernels, "matmul_bias"))
    values = [_hand_record(mod, 0.5, "D", factor).as_json() for factor in (16, 8, 4)]
    with hostile_artifacts(values) as url:
        db = Database(url, target=host_target())
        db.commit_workload(mod)
        assert len(db.get_all_tuning_records()) == 1  # the first, checked within the budget
    said = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
    assert len(said) == 1 and "ignoring 2 more record(s) of this workload" in said[0], said
    assert "checking its records took" in said[0]


# -- tune --tvm: the validation of a best schedule -------------------------------------------
def _variant(mod: Any, old: str, new: str) -> Any:
    """``mod`` with one line of its TVMScript changed, compiled for this CPU."""
    text = mod.script()
    assert old in text
    return tvm.tirx.build(tvm.script.from_source(text.replace(old, new)),
                          target=tvm.target.Target(host_target()))  # fmt: skip


def test_validation_fails_wrong_and_unwritten_outputs(kernels: Path) -> None:
    from backends.tvm.golden import Reference
    from tunecache_cli.tune_tvm import max_error

    mod = _normalized(_load(kernels, "matmul_bias"))
    reference = Reference(mod, host_target(), seeds=(1, 2))
    assert reference.outputs == (3,)  # D, found by running the function
    inputs = reference.inputs(1)
    assert all(bool((t != 0).all()) for t in inputs[:3]) and bool(inputs[3].isnan().all())
    assert max_error(reference, reference.lib) == (0.0, "")
    unwritten = _variant(mod, "for i, j in T.grid(64, 64):", "for i, j in T.grid(63, 64):")
    assert max_error(reference, unwritten) == (None, "output has NaN or inf")
    wrong = _variant(mod, "C[v_i, v_j] + bias[v_j]", "C[v_i, v_j] + bias[v_j] * T.float32(1.01)")
    error, _ = max_error(reference, wrong)
    assert error is not None and error > 1e-4  # over the float32 tolerance


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "bool"])
def test_validation_takes_outputs_of_every_integer_width(dtype: str) -> None:
    """An int8 function's outputs were filled with -0x5EED before each run: "value cannot be
    converted to type int8_t without overflow", ``tune --tvm``'s internal error."""
    from tvm import te

    from backends.tvm.golden import Reference
    from tunecache_cli.tune_tvm import max_error

    a = te.placeholder((8, 8), name="A", dtype=dtype)
    out = te.compute((8, 8), lambda i, j: a[j, i] | a[i, j] if dtype == "bool"
                     else a[j, i] + a[i, j], name="out")  # fmt: skip
    reference = Reference(_normalized(te.create_prim_func([a, out])), host_target(), seeds=(1,))
    assert reference.outputs == (1,)
    (given, _), (expected,) = reference.inputs(1), reference.expected[0]
    assert bool((expected == (given | given.T if dtype == "bool" else given + given.T)).all())
    assert max_error(reference, reference.lib) == (0.0, "")


def test_validation_fails_an_unwritten_flag_or_small_integer() -> None:
    """Outputs of flags and integers start with a fill, and one fill for every seed passed an
    element left unwritten whose expected value it was: ``A != 0`` on non-zero inputs is True
    everywhere, the fill was True, and a schedule writing 1 of 64 elements passed."""
    from tvm import te

    from backends.tvm.golden import Reference
    from tunecache_cli.tune_tvm import SEEDS, max_error

    a = te.placeholder((8, 8), name="A", dtype="float32")
    out = te.compute((8, 8), lambda i, j: a[i, j] != tvm.tirx.const(0, "float32"), name="out")
    mod = _normalized(te.create_prim_func([a, out]))
    reference = Reference(mod, host_target(), SEEDS)
    assert bool(reference.expected[0][0].all())  # True everywhere: the odd seed's fill
    assert max_error(reference, reference.lib) == (0.0, "")
    for grid in ("T.grid(1, 1)", "T.grid(7, 8)"):
        unwritten = _variant(mod, "T.grid(8, 8)", grid)
        error, _ = max_error(reference, unwritten)
        assert error != 0.0, grid


# -- tune --tvm: bad input is one line and exit 2 --------------------------------------------
BAD_TVM = [
    ("{dir}/missing.py:matmul_bias", "no Python file"),
    ("{bare}:matmul_bias", "no Python file '{bare}' (did you mean {kernels}:matmul_bias?)"),
    ("{kernels}", "wants FILE.py:NAME"),
    ("{kernels}:", "wants FILE.py:NAME"),
    ("{kernels}:nothing_here", "has no 'nothing_here'"),
    ("{kernels}:not_tvm", "is of type int, not a TVM PrimFunc or IRModule"),
    ("{kernels}:Mlp", "Mlp is an nn.Module, for tune --torch, not a TVM PrimFunc or IRModule"),
    ("{kernels}:raises", "raises() raised RuntimeError: no kernel today"),
    ("{broken}:f", "SyntaxError"),
]


@pytest.mark.parametrize(("spec", "message"), BAD_TVM)
def test_tune_tvm_bad_input_is_one_line(
    spec: str, message: str, kernels: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n    pass\n")
    bare = kernels.with_suffix("")  # "user_kernels:f" for "user_kernels.py:f"
    spec = spec.format(dir=tmp_path, kernels=kernels, broken=broken, bare=bare)
    message = message.format(kernels=kernels, bare=bare)
    code = cli_main(["tune", "--tvm", spec, "--trials", "2", "--no-upload"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("tunecache: error:"), err
    assert message in err


def test_tune_tvm_refuses_cuda_and_needs_a_token(
    kernels: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = f"{kernels}:matmul_bias"
    assert cli_main(["tune", "--tvm", spec, "--device", "cuda"]) == 2
    assert "--device cuda" in capsys.readouterr().err
    monkeypatch.delenv("TUNECACHE_TOKEN")
    assert cli_main(["tune", "--tvm", spec, "--server", "http://127.0.0.1:9"]) == 2
    assert "'write' scope" in capsys.readouterr().err


def test_tune_tvm_bad_input_in_a_subprocess_has_no_traceback(tmp_path: Path) -> None:
    (tmp_path / "k.py").write_text("import tvm\nthing = [1, 2]\n")
    done = subprocess.run(
        [sys.executable, "-m", "tunecache_cli", "tune", "--tvm", "k.py:thing", "--no-upload"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "tunecache: error: --tvm 'k.py:thing': thing is of type list, not a TVM PrimFunc or IRModule "
        "(or a function of no arguments returning one)"
    ]


@pytest.mark.parametrize("spec", ["nope.py:f", "k.py", "k.txt:f"])
def test_tune_tvm_says_a_mistyped_file_before_importing_tvm(tmp_path: Path, spec: str) -> None:
    """TVM's import takes seconds: a path that names no Python file is said without it."""
    script = ("import sys, tunecache_cli\n"
              f"code = tunecache_cli.main(['tune', '--tvm', {spec!r}, '--no-upload'])\n"
              "print(code, 'tvm' in sys.modules)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)  # fmt: skip
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr
    assert done.stderr.startswith("tunecache: error: --tvm")
