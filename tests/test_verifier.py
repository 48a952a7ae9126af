"""The verifier (``tunecache daemon --verify``) on this CPU, end to end through a real server.

Records uploaded with a write token are claims: their validation and their time. A verifier
re-validates them in its own worker processes, against the float64 golden reference, and re-times
them; under ``--policy verified`` only what it verified is served, ranked by its own time.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, start_server
from tests.factories import AUTH, TINY, make_record
from tunecache import Client, key_for
from tunecache.key import Key
from tunecache.schemas import RecordPublic
from tunecache.strict import SERVED
from tunecache.verification import VerifyTask
from tuner.harness import Harness
from tuner.verify import Verifier, VerifierOptions

# A matmul knob config outside its space: 5 is not one of the unroll knob's values.
OUTSIDE = {"schedule": "knobs", "tile_i": 8, "tile_j": 32, "tile_k": 16, "vectorize": True,
           "parallel": True, "unroll": 5}  # fmt: skip


def token(url: str, name: str, scope: str) -> str:
    answer = httpx.post(f"{url}/v1/tokens", json={"name": name, "scope": scope}, headers=AUTH)
    assert answer.status_code == 201, answer.text
    created: str = answer.json()["token"]
    return created


@pytest.fixture
def verified_server(tmp_path: Path) -> Iterator[LiveServer]:
    db_path = tmp_path / "cache.db"
    live = start_server(f"sqlite:///{db_path}", db_path, tmp_path / "server.log",
                        args=["--policy", "verified"])  # fmt: skip
    yield live
    live.stop()


@pytest.mark.slow
def test_a_verifier_verifies_tvm_and_inductor_records_and_flags_fake_times(
    verified_server: LiveServer, tmp_path: Path
) -> None:
    url = verified_server.url
    tvm = key_for("matmul", "tvm", TINY["matmul"], "float32")
    inductor = key_for("softmax", "inductor", TINY["softmax"], "float32")
    outside = key_for("matmul", "tvm", {"M": 48, "N": 40, "K": 16}, "float32")  # another bucket
    elsewhere = dataclasses.replace(tvm, environment={"apache-tvm": "0.1.0"})  # not installed here
    # A record naming a module of the verifier's own directory: never imported (no --kernels).
    marker = tmp_path / "imported"
    (tmp_path / "evilmod.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    foreign = dataclasses.replace(tvm, kernel="evilmod:Kernel")
    writer = token(url, "laptop", "write")
    with Client(url, token=writer) as client:
        ids = {
            "tvm": client.upload(make_record(tvm, time_ms=0.001,
                                             config={"schedule": "default"})).record_id,
            "inductor": client.upload(make_record(inductor, time_ms=0.001,
                                                  config={"mode": "default"})).record_id,
            "outside": client.upload(make_record(outside, time_ms=0.001,
                                                 config=OUTSIDE)).record_id,
            "elsewhere": client.upload(make_record(elsewhere, time_ms=0.001,
                                                   config={"schedule": "default"})).record_id,
            "foreign": client.upload(make_record(foreign, time_ms=0.001,
                                                 config={"schedule": "default"})).record_id,
        }  # fmt: skip
        assert client.lookup(tvm, default={"d": 1}).source == "default"  # pending: not served

    env = {**os.environ, "TUNECACHE_TOKEN": token(url, "cpu-verifier", "verify")}
    done = subprocess.run(
        [sys.executable, "-m", "tunecache_cli", "daemon", "--verify", "--once", "--server", url,
         "--backends", "tvm,inductor", "--workers", "1"],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 verified, 1 rejected), 2 given back as unverifiable" in done.stderr, done.stderr
    assert not marker.exists()

    with Client(url) as client:
        records = {name: client.get_record(record_id) for name, record_id in ids.items()}
        for name in ("tvm", "inductor"):
            record = records[name]
            check = record.verification
            assert record.status == "verified" and check is not None, name
            assert check.verifier == "cpu-verifier" and check.passed
            assert check.timing is not None and check.timing.median_ms > 0.001
            assert check.timing_flag and check.time_ratio is not None and check.time_ratio > 1.25
            assert check.validation is not None and len(check.validation.checks) >= 2  # + edge
        assert records["outside"].status == "rejected"
        assert records["outside"].verification is not None
        assert "outside the kernel's space" in records["outside"].verification.error
        assert records["elsewhere"].status == "pending"  # another verifier may have 0.1.0
        assert records["foreign"].status == "pending"
        served = client.lookup(tvm, default={"d": 1})
        assert served.source == "server" and served.record is not None
        assert served.record.id == ids["tvm"]
        # ranked by the verifier's time from now on: the fake 0.001 ms no longer counts
        assert served.time_ms == records["tvm"].verification.timing.median_ms  # type: ignore[union-attr]
        assert client.lookup(inductor, default={"d": 1}).source == "server"
        assert client.lookup(outside, default={"d": 1}).source == "default"


def test_the_verifier_needs_the_verify_scope(server: LiveServer, tmp_path: Path) -> None:
    env = {**os.environ, "TUNECACHE_TOKEN": token(server.url, "laptop", "write")}
    done = subprocess.run(
        [sys.executable, "-m", "tunecache_cli", "daemon", "--verify", "--once", "--server",
         server.url], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 4, done.stderr
    assert "needs the 'verify' scope; token 'laptop' has write" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_builtin_kernels_record_or_job_at_a_problem_it_does_not_take_is_refused(
    server: LiveServer,
) -> None:
    record = make_record(key_for("matmul", "tvm", TINY["matmul"], "float32"),
                         config={"schedule": "default"}).model_dump(mode="json", by_alias=True)  # fmt: skip
    record["key"]["problem"]["layout"] = "row"  # a verifier or daemon would run it as matmul
    answer = httpx.post(f"{server.url}/v1/records", json=record, headers=AUTH)
    assert answer.status_code == 422, answer.text
    assert "matmul takes shape parameters M, N, K: unknown layout" in answer.text
    job = httpx.post(f"{server.url}/v1/jobs", json={"key": record["key"]}, headers=AUTH)
    assert job.status_code == 422 and "unknown layout" in job.text, job.text
    with Client(server.url) as client:
        assert client.list_records().count == 0 and client.list_jobs().count == 0


def _leased(key: Key, problem: dict[str, Any]) -> VerifyTask:
    """``key``'s record at ``problem`` as a verifier is handed it: stored before the server
    checked a built-in kernel's problem."""
    body = make_record(key, config={"schedule": "default"}).model_dump(mode="json", by_alias=True)
    body["key"]["problem"].update(problem)
    stored = {**body, "id": 7, "key_hash": "0" * 64, "created_at": "2026-01-01T00:00:00Z"}
    return VerifyTask(record=RecordPublic.model_validate(stored, context=SERVED),
                      lease_expires_at=datetime.now(UTC))  # fmt: skip


@pytest.mark.parametrize(("problem", "outcome", "why"), [
    ({"layout": "row"}, "failed", "matmul takes shape parameters M, N, K: unknown layout"),
    ({"M": 1 << 20, "N": 1 << 20, "K": 1 << 20}, "unverifiable", "GiB; this cpu device has"),
])  # fmt: skip
def test_the_verifier_rejects_or_gives_back_a_stored_record_it_cannot_run(
    problem: dict[str, Any], outcome: str, why: str
) -> None:
    """At a problem its kernel does not take, it is wrong everywhere: rejected. Over this
    machine's memory, another verifier may run it: given back. Neither is run."""
    key = key_for("matmul", "tvm", TINY["matmul"], "float32")
    with Client("http://127.0.0.1:9") as client, Harness(workers=1) as harness:
        verifier = Verifier(client, VerifierOptions(backends=("tvm",)))
        finding = verifier.finding(_leased(key, problem), harness)  # no worker process is asked
    assert finding.outcome == outcome, finding
    assert why in finding.error


def test_a_stored_record_at_a_problem_its_kernel_does_not_take_stays_readable(
    server: LiveServer,
) -> None:
    """Stored before uploads were checked: it reads back (records show), and a snapshot of its
    arch leaves it out (another server would refuse it; no lookup ever asks for it)."""
    from cache_server.db import make_engine, make_sessionmaker
    from cache_server.queries import add_record
    from tunecache.schemas import RecordCreate
    from tunecache.strict import STORED

    key = key_for("matmul", "tvm", TINY["matmul"], "float32")
    body = make_record(key, config={"schedule": "default"}).model_dump(mode="json", by_alias=True)
    body["key"]["problem"]["layout"] = "row"
    legacy = RecordCreate.model_validate(body, context=STORED)
    engine = make_engine(server.db)
    try:
        with make_sessionmaker(engine).begin() as session:
            legacy_id = add_record(session, key_hash=legacy.key.digest(), record=legacy).record_id
    finally:
        engine.dispose()
    with Client(server.url) as client:
        client.upload(make_record(key, config={"schedule": "default"}))
        assert client.get_record(legacy_id).key.problem["layout"] == "row"
        document, _ = client.export_snapshot(key.device.arch)
    assert document is not None
    assert [r["key"]["problem"] for r in document["records"]] == [dict(key.problem)]


def test_a_record_whose_check_fails_as_nothing_foresaw_is_unverifiable_not_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kernel's code run in the verifier's own process (its class, problem, space) raising what
    nothing caught ended the verifier, and each that claimed the record next. Now the record is
    given back unverifiable, saying why, and the workers are started afresh. (The error is
    raised where the check is called: the verifier's boundary.)"""
    key = key_for("matmul", "tvm", TINY["matmul"], "float32")

    def check(self: Verifier, task: Any, harness: Harness) -> Any:
        raise ZeroDivisionError("division by zero\nin the kernel's code")

    monkeypatch.setattr(Verifier, "check", check)
    with Client("http://127.0.0.1:9") as client, Harness(workers=1) as harness:
        verifier = Verifier(client, VerifierOptions(backends=("tvm",)))
        before = harness._slots[0].process.pid
        finding = verifier.finding(_leased(key, dict(key.problem)), harness)
        assert harness._slots[0].process.pid != before and harness.replaced == 1
    assert finding.outcome == "unverifiable", finding
    assert finding.error == "internal error: ZeroDivisionError: division by zero"


def _handing_out(task: VerifyTask, *, refuse: bool) -> Any:
    """A server at the verifier's transport that hands ``task`` out at every claim and answers
    each finding with 409 (``refuse``) or takes it."""
    import json

    from tests.hostile import answer

    record = task.record.model_dump(mode="json", by_alias=True)
    handed = json.dumps(task.model_dump(mode="json", by_alias=True)).encode()

    def behaviour(conn: Any, request: Any, seen: Any) -> None:
        if request.path.startswith("/v1/verifications/claim"):
            answer(conn, 200, handed)
        elif refuse:
            answer(conn, 409, b'{"status": 409, "detail": "not leased", "errors": []}')
        else:
            answer(conn, 200, json.dumps({**record, "status": "rejected"}).encode())

    return behaviour


def test_a_verifier_handed_one_record_again_and_again_neither_spins_nor_runs_for_ever() -> None:
    """A server handing out one record at every claim and refusing each finding was claimed
    from 11 times a second (the verifier took a finding not stored as work done); with
    ``--once``, taking each finding, it was checked 164 times and the verifier never ended.
    Now a finding not stored waits before the next claim, as the daemon's failed jobs do, and
    a ``--once`` verifier stops at a record it reported already."""
    import threading
    import time

    from tests.hostile import serve

    key = key_for("matmul", "tvm", TINY["matmul"], "float32")
    task = _leased(key, {"layout": "row"})  # found wrong at once: no worker is asked
    options = VerifierOptions(backends=("tvm",), poll_seconds=1.0)
    with serve(_handing_out(task, refuse=True)) as (url, seen), Client(url, token="t") as client:
        verifier = Verifier(client, options)
        runner = threading.Thread(target=verifier.run)
        runner.start()
        time.sleep(3)
        verifier.stop()
        runner.join(30)
    claims = sum(r.startswith("POST /v1/verifications/claim") for r in seen.requests)
    assert 1 <= claims <= 10, claims  # 0.1 s, doubling to the poll's 1 s: 7 in 3 s at most
    once = dataclasses.replace(options, once=True)
    with serve(_handing_out(task, refuse=False)) as (url, seen), Client(url, token="t") as client:
        verifier = Verifier(client, once)
        runner = threading.Thread(target=verifier.run, daemon=True)
        runner.start()
        runner.join(60)
        assert not runner.is_alive()
    assert verifier.outcomes == {7: "failed"}
    assert sum(r.startswith("POST /v1/verifications/claim") for r in seen.requests) == 2


def test_a_verification_task_past_its_bound_is_not_read() -> None:
    """One claim answered with 128 MiB of disputed problems held a verifier at 5.4 GB (the
    bound was any answer's, 256 MiB): a task is a record and its problems, at most twice the
    bytes of a record's trials."""
    import json

    from tests.hostile import answer, serve
    from tunecache.errors import ServerError
    from tunecache.worker_calls import TASK_ANSWER_BYTES

    key = key_for("matmul", "tvm", TINY["matmul"], "float32")
    task = _leased(key, {}).model_dump(mode="json", by_alias=True)
    wide = {f"D{i}": i + 1 for i in range(32)}
    many = 2 + TASK_ANSWER_BYTES // len(json.dumps(wide))
    body = json.dumps({**task, "disputed_problems": [wide] * many}).encode()

    def behaviour(conn: Any, request: Any, seen: Any) -> None:
        answer(conn, 200, body)

    with (serve(behaviour) as (url, _), Client(url, token="t") as client,
          pytest.raises(ServerError)):  # fmt: skip
        client.claim_verification("v", device_arch=key.device.arch, backends=["tvm"])
    small = json.dumps({**task, "disputed_problems": [wide] * 1000}).encode()
    with (serve(lambda conn, request, seen: answer(conn, 200, small)) as (url, _),
          Client(url, token="t") as client):  # fmt: skip
        claimed = client.claim_verification("v", device_arch=key.device.arch, backends=["tvm"])
    assert claimed is not None and len(claimed.disputed_problems) == 64
