"""Trust: the client checks every served record; disputes; the verified policy; trusted tokens.

Issue 24's findings 3 (a served record that is unvalidated, or whose key names another kernel on
another device, was launched) and the dispute and policy machinery, through a real server on
loopback and through a hostile server at the client's transport.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, start_server
from tests.factories import AUTH, CPU, knobs, make_key, make_record, miss
from tunecache import Client, Key
from tunecache.schemas import CheckModel, LookupRequest, LookupResponse, RecordCreate, RecordPublic
from tunecache.verification import DisputeCreate

DEFAULT = knobs(99)


def token(url: str, name: str, scope: str, *, trusted: bool = False) -> str:
    answer = httpx.post(f"{url}/v1/tokens", json={"name": name, "scope": scope,
                                                 "trusted": trusted}, headers=AUTH)  # fmt: skip
    assert answer.status_code == 201, answer.text
    created: str = answer.json()["token"]
    return created


def failed_check(key: Key) -> CheckModel:
    return CheckModel(problem=dict(key.problem), seed=1, rel_error=0.7, max_abs_error=3.0,
                      tolerance=1e-4, passed=False, note="wrong at this shape")  # fmt: skip


def post_dispute(url: str, record_id: int, headers: dict[str, str],
                 body: dict[str, Any]) -> httpx.Response:  # fmt: skip
    return httpx.post(f"{url}/v1/records/{record_id}/disputes", json=body, headers=headers)


def dispute_body(key: Key, problem: dict[str, Any] | None = None) -> dict[str, Any]:
    body = DisputeCreate(problem=problem or dict(key.problem), check=failed_check(key))
    return body.model_dump(mode="json")


# -- a hostile server at the client's transport -------------------------------------------------
def public(record: RecordCreate, **fields: Any) -> RecordPublic:
    data = record.model_dump(mode="json", by_alias=True)
    return RecordPublic.model_validate({**data, "id": 7, "key_hash": "0" * 64,
                                        "created_at": "2026-01-01T00:00:00Z", **fields})  # fmt: skip


def hostile(answer: Any) -> Client:
    """A client whose server answers every lookup with ``answer(asked key)``: a LookupResponse."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/lookup":
            return miss()
        key = LookupRequest.model_validate_json(request.content).key.to_key()
        return httpx.Response(200, content=answer(key).model_dump_json(by_alias=True))

    return Client("http://hostile.test", transport=httpx.MockTransport(handle), token="")


def unvalidated(key: Key) -> LookupResponse:
    return LookupResponse(record=public(make_record(key, passed=False)))


def disputed(key: Key) -> LookupResponse:
    return LookupResponse(record=public(make_record(key), status="disputed"))


def rejected(key: Key) -> LookupResponse:
    return LookupResponse(record=public(make_record(key), status="rejected"))


def another_kernel_elsewhere(key: Key) -> LookupResponse:
    import dataclasses

    elsewhere = dataclasses.replace(make_key(m=key.problem["M"], kernel="softmax"),
                                    device=dataclasses.replace(CPU, arch="sm_90", kind="cuda",
                                                               name="nvidia-h100"))  # fmt: skip
    return LookupResponse(record=public(make_record(elsewhere)))


def another_shape_called_exact(key: Key) -> LookupResponse:
    return LookupResponse(record=public(make_record(make_key(m=2 * key.problem["M"]))),
                          match="exact")  # fmt: skip


def outside_the_space(key: Key) -> LookupResponse:
    hostile_config = {"schedule": "knobs", "tile_i": "4; rm -rf /"}  # a knob is a number
    return LookupResponse(record=public(make_record(key), config=hostile_config))


def well_formed(key: Key) -> LookupResponse:
    return LookupResponse(record=public(make_record(key, config=knobs(4))))


@pytest.mark.parametrize("answer", [unvalidated, disputed, rejected, another_kernel_elsewhere,
                                    another_shape_called_exact, outside_the_space])  # fmt: skip
def test_the_client_refuses_a_served_record_it_must_not_use(
    answer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    key = make_key(m=64)
    with hostile(answer) as client:
        result = client.lookup(key, default=DEFAULT)
        again = client.lookup(key, default=DEFAULT)
    assert (result.source, result.config, result.hit) == ("default", DEFAULT, False)
    assert again.source == "default"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "ignoring record #7" in warnings[0], warnings


def test_the_same_hostile_server_is_believed_when_its_record_is_sound() -> None:
    """The check above is not vacuous: a sound record from the same transport is served."""
    with hostile(well_formed) as client:
        result = client.lookup(make_key(m=64), default=DEFAULT)
    assert (result.source, result.config) == ("server", knobs(4))


def test_a_record_unvalidated_in_the_servers_own_database_is_refused(server: LiveServer) -> None:
    """A compromised database makes an unvalidated record a winner: the client still refuses."""
    key = make_key(m=64)
    with Client(server.url) as client:
        stored = client.upload(make_record(key, passed=False))
    assert stored.winner_record_id is None  # the server itself never serves it
    assert server.db_path is not None
    with sqlite3.connect(server.db_path) as db:
        db.execute("insert into winners (key_hash, record_id, time_ms, updated_at) values "
                   "(?, ?, 0.001, '2026-01-01')", (stored.key_hash, stored.record_id))  # fmt: skip
    assert httpx.post(f"{server.url}/v1/lookup", json={"key": key.to_json()}).status_code == 200
    with Client(server.url) as client:
        result = client.lookup(key, default=DEFAULT)
    assert (result.source, result.config) == ("default", DEFAULT)


# -- the server refuses what a client must never be served ---------------------------------------
@pytest.mark.parametrize(
    ("backend", "config", "named"),
    [
        ("triton", {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 0, "num_warps": 4,
                    "num_stages": 3}, "GROUP_M=0"),
        ("triton", {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4.0,
                    "num_stages": 3}, "num_warps=4.0"),
        ("tvm", {"schedule": "meta_schedule", "trace": [[["Annotate", ["b0", "\"x\""],
                 ["pragma_import_llvm"], []]], []], "target": {"kind": "llvm"}},
         "pragma_import_llvm"),
        ("inductor", {"mode": "max-autotune", "backend": "SHELL"}, "SHELL"),
    ],
)  # fmt: skip
def test_an_upload_outside_its_backends_closed_schema_is_a_422_naming_the_field(
    shared_server: LiveServer, backend: str, config: dict[str, Any], named: str
) -> None:
    record = make_record(make_key(m=64, backend=backend)).model_dump(mode="json", by_alias=True)
    answer = httpx.post(f"{shared_server.url}/v1/records", json={**record, "config": config},
                        headers=AUTH)  # fmt: skip
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert detail.startswith("body.config:") and named in detail, detail


# -- disputes -------------------------------------------------------------------------------
def test_a_dispute_needs_a_token_and_stops_the_record_being_served(server: LiveServer) -> None:
    key = make_key(m=64)
    with Client(server.url) as client:
        fast = client.upload(make_record(key, time_ms=1.0, config=knobs(1)))
        slow = client.upload(make_record(key, time_ms=2.0, config=knobs(2)))
    assert fast.is_winner and not slow.is_winner
    url = f"{server.url}/v1/records/{fast.record_id}/disputes"
    anonymous = httpx.post(url, json=dispute_body(key))
    assert anonymous.status_code == 401  # reads are open; disputes are not
    reader = {"Authorization": f"Bearer {token(server.url, 'consumer', 'read')}"}
    first = httpx.post(url, json=dispute_body(key), headers=reader)
    assert first.status_code == 200, first.text
    assert first.json() == {"record_id": fast.record_id, "status": "disputed", "disputes": 1}
    again = httpx.post(url, json=dispute_body(key), headers=reader)
    assert again.json()["disputes"] == 1  # one open dispute per token and record
    with Client(server.url) as client:
        served = client.lookup(key, default=DEFAULT)
        assert served.config == knobs(2)  # the next fastest record serves now
        shown = client.get_record(fast.record_id)
    assert (shown.status, shown.disputes, shown.is_winner) == ("disputed", 1, False)
    elsewhere = httpx.post(url, json=dispute_body(key, {"M": 64, "N": 32, "K": 64}),
                           headers=reader)  # fmt: skip
    assert elsewhere.status_code == 409 and "shape bucket" in elsewhere.json()["detail"]
    passed = {**dispute_body(key), "check": {**dispute_body(key)["check"], "passed": True,
                                             "rel_error": 0.0}}  # fmt: skip
    assert httpx.post(url, json=passed, headers=reader).status_code == 422
    missing = httpx.post(f"{server.url}/v1/records/99999/disputes", json=dispute_body(key),
                         headers=reader)  # fmt: skip
    assert missing.status_code == 404


def test_a_record_sent_again_is_stored_once_and_a_disputed_one_stays_disputed(
    server: LiveServer,
) -> None:
    """An upload whose answer was lost is sent again (by the outbox, a daemon, ``push``): the same
    token's same record is stored once, and a 200 says where it stands. Before, each sending
    stored another record, and one sent again after a dispute was stored anew, pending, and
    served. Another token's copy is its own upload, whatever its name."""
    key = make_key(m=64)
    body = make_record(key, time_ms=1.0, config=knobs(1)).model_dump(mode="json", by_alias=True)

    def send(headers: dict[str, str] = AUTH) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/records", json=body, headers=headers)

    first, again = send(), send()
    assert (first.status_code, again.status_code) == (201, 200), again.text
    assert again.json() == first.json() and first.json()["is_winner"]
    record_id = first.json()["record_id"]
    reader = {"Authorization": f"Bearer {token(server.url, 'consumer', 'read')}"}
    assert post_dispute(server.url, record_id, reader, dispute_body(key)).status_code == 200
    after = send()
    assert after.status_code == 200
    assert after.json() == {**first.json(), "status": "disputed", "is_winner": False,
                            "winner_record_id": None}  # fmt: skip
    with Client(server.url) as client:
        assert client.lookup(key, default=DEFAULT).config == DEFAULT  # not served again
    twins = [token(server.url, f"twin-{n}", "write") for n in range(2)]  # two tokens
    theirs = [send({"Authorization": f"Bearer {twin}"}) for twin in twins]
    assert [a.status_code for a in theirs] == [201, 201]
    assert len({record_id, *(a.json()["record_id"] for a in theirs)}) == 3
    if server.db_path is not None:
        with sqlite3.connect(server.db_path) as db:
            assert db.execute("select count(*) from records").fetchone()[0] == 3


def test_a_first_use_check_that_fails_falls_back_and_disputes_the_record(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    key = make_key(m=64)
    with Client(server.url) as client:
        stored = client.upload(make_record(key, config=knobs(4)))
    consumer = token(server.url, "consumer", "read")
    checked: list[dict[str, Any]] = []

    def wrong(config: dict[str, Any]) -> CheckModel:
        checked.append(config)
        return failed_check(key)

    with Client(server.url, token=consumer) as client:
        result = client.lookup(key, default=DEFAULT, verify=wrong)
    assert (result.source, result.config) == ("default", DEFAULT) and checked == [knobs(4)]
    assert any("failed its check on first use" in r.getMessage() for r in caplog.records)
    with Client(server.url) as client:  # close() above sent the dispute
        assert client.get_record(stored.record_id).status == "disputed"
        assert client.lookup(key, default=DEFAULT).source == "default"  # served no more


def test_a_first_use_check_that_passes_runs_once(server: LiveServer) -> None:
    key = make_key(m=64)
    with Client(server.url) as client:
        client.upload(make_record(key, config=knobs(4)))
    calls: list[dict[str, Any]] = []

    def right(config: dict[str, Any]) -> CheckModel:
        calls.append(config)
        return CheckModel(problem=dict(key.problem), seed=1, rel_error=0.0, max_abs_error=0.0,
                          tolerance=1e-4, passed=True)  # fmt: skip

    with Client(server.url) as client:
        first = client.lookup(key, default=DEFAULT, verify=right)
        second = client.lookup(key, default=DEFAULT, verify=right)
    assert (first.source, second.source) == ("server", "memo") and calls == [knobs(4)]


def test_a_first_use_check_that_raises_counts_as_failed(server: LiveServer) -> None:
    key = make_key(m=64)
    with Client(server.url) as client:
        client.upload(make_record(key, config=knobs(4)))

    def crashes(config: dict[str, Any]) -> CheckModel:
        raise RuntimeError("the served config crashed the kernel")

    with Client(server.url) as client:
        result = client.lookup(key, default=DEFAULT, verify=crashes)
    assert (result.source, result.config) == ("default", DEFAULT)
    with Client(server.url) as client:  # close() above sent the dispute
        assert client.list_records(kernel=key.kernel).items[0].status == "disputed"


def test_a_check_that_cannot_run_here_neither_uses_nor_disputes_the_record(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Short of memory for the check's copies, a process must not take a good record out of
    service for everyone."""
    from tunecache import CheckUnavailable

    key = make_key(m=64)
    with Client(server.url) as client:
        stored = client.upload(make_record(key, config=knobs(4)))

    calls: list[dict[str, Any]] = []

    def no_memory(config: dict[str, Any]) -> CheckModel:
        calls.append(config)
        raise CheckUnavailable("CUDA out of memory for the copies")

    with Client(server.url, token=token(server.url, "consumer", "read")) as client:
        result = client.lookup(key, default=DEFAULT, verify=no_memory)
        again = client.lookup(key, default=DEFAULT, verify=no_memory)  # not checked again yet
    assert (result.source, result.config) == ("default", DEFAULT) == (again.source, again.config)
    assert calls == [knobs(4)]
    assert any("not disputing it" in r.getMessage() for r in caplog.records)
    with Client(server.url) as client:  # close() above would have sent a dispute
        assert client.get_record(stored.record_id).status != "disputed"
        assert client.lookup(key, default=DEFAULT).config == knobs(4)  # still served


def test_an_async_lookup_checks_a_memo_answer_it_has_not_checked(server: LiveServer) -> None:
    """A memo answer filled by a caller that did not verify is checked before ``alookup(verify=)``
    uses it (it was returned at once, unchecked)."""
    import asyncio

    key = make_key(m=64)
    with Client(server.url) as client:
        client.upload(make_record(key, config=knobs(4)))
        assert client.lookup(key, default=DEFAULT).config == knobs(4)  # memoised, unchecked
        checked = asyncio.run(client.alookup(key, default=DEFAULT,
                                             verify=lambda config: failed_check(key)))  # fmt: skip
    assert (checked.source, checked.config) == ("default", DEFAULT)


# -- the verified policy and trusted tokens -----------------------------------------------------
@pytest.fixture
def verified_server(tmp_path: Path) -> Any:
    db_path = tmp_path / "cache.db"
    live = start_server(f"sqlite:///{db_path}", db_path, tmp_path / "server.log",
                        args=["--policy", "verified"])  # fmt: skip
    yield live
    live.stop()


def test_the_verified_policy_serves_only_verified_records(verified_server: LiveServer) -> None:
    url = verified_server.url
    key, other = make_key(m=64), make_key(m=2048)
    writer = token(url, "laptop", "write")
    trusted = token(url, "ci", "write", trusted=True)
    with Client(url, token=writer) as client:
        pending = client.upload(make_record(key, time_ms=0.5, config=knobs(1)))
    assert httpx.post(f"{url}/v1/lookup", json={"key": key.to_json()}).status_code == 404
    with Client(url, token=trusted) as client:
        client.upload(make_record(key, time_ms=2.0, config=knobs(2)))
        client.upload(make_record(other, time_ms=1.0, config=knobs(3)))
    with Client(url) as client:
        assert client.lookup(key, default=DEFAULT).config == knobs(2)  # verified, though slower
        assert client.lookup(other, default=DEFAULT).config == knobs(3)
        shown = client.get_record(pending.record_id)
    assert (shown.status, shown.uploaded_by) == ("pending", "laptop")
    snapshot = httpx.get(f"{url}/v1/snapshot", params={"device_arch": CPU.arch}).json()
    assert sorted(r["config"]["tile_i"] for r in snapshot["records"]) == [2, 3]


def test_a_verifier_claims_disputed_records_first_and_settles_them(server: LiveServer) -> None:
    url = server.url
    verifier = token(url, "gpu-verifier", "verify")
    with Client(url) as client:
        first = client.upload(make_record(make_key(m=64), config=knobs(1), time_ms=1.0))
        second = client.upload(make_record(make_key(m=128), config=knobs(2), time_ms=1.0))
    reader = {"Authorization": f"Bearer {token(url, 'consumer', 'read')}"}
    disputed_at = {"M": 100, "N": 64, "K": 64}  # in the record's bucket (M 65..128)
    answer = httpx.post(f"{url}/v1/records/{second.record_id}/disputes", headers=reader,
                        json=dispute_body(make_key(m=128), disputed_at))  # fmt: skip
    assert answer.status_code == 200, answer.text
    with Client(url, token=verifier) as client:
        task = client.claim_verification("v1", device_arch=CPU.arch, backends=["tvm"])
        assert task is not None and task.record.id == second.record_id  # disputed first
        assert task.disputed_problems == [disputed_at]
        # Asked again (its answer lost): v1's own record, its lease as it was, not a second one.
        again = client.claim_verification("v1", device_arch=CPU.arch, backends=["tvm"])
        assert again is not None and again.record.id == second.record_id
        assert again.lease_expires_at == task.lease_expires_at
        other = client.claim_verification("v2", device_arch=CPU.arch, backends=["tvm"])
        assert other is not None and other.record.id == first.record_id  # never the same one
        assert client.claim_verification("v3", device_arch=CPU.arch, backends=["tvm"]) is None
        from tunecache.verification import VerificationCreate

        timing = make_record(make_key(), time_ms=1.6).timing
        report = make_record(make_key()).validation
        passed = VerificationCreate(worker="v1", outcome="passed", device_name="verifier-cpu",
                                    timing=timing, validation=report)  # fmt: skip
        with pytest.raises(Exception, match="409"):  # not v2's lease
            client.submit_verification(second.record_id, passed.model_copy(update={"worker": "v2"}))
        settled = client.submit_verification(second.record_id, passed)
        failed = make_record(make_key(), passed=False).validation
        rejected = client.submit_verification(first.record_id, VerificationCreate(
            worker="v2", outcome="failed", device_name="verifier-cpu", validation=failed))  # fmt: skip
    assert settled.status == "verified" and settled.verification is not None
    assert settled.verification.verifier == "gpu-verifier"
    assert settled.verification.timing_flag  # uploaded 1.0 ms, the verifier saw 1.6 ms
    assert settled.verification.time_ratio == pytest.approx(1.6)
    assert rejected.status == "rejected"
    with Client(url) as client:
        # verified: served again, ranked by the verifier's time; rejected: never served
        assert client.lookup(make_key(m=128), default=DEFAULT).config == knobs(2)
        assert client.lookup(make_key(m=64), default=DEFAULT).source == "default"


def test_status_changes_keep_the_fastest_servable_winner_under_concurrent_uploads(
    server: LiveServer,
) -> None:
    """Disputes and uploads of one key racing: the winner is always the fastest record that
    may be served, never a disputed one."""
    import concurrent.futures

    key = make_key(m=64)
    reader = {"Authorization": f"Bearer {token(server.url, 'consumer', 'read')}"}
    with Client(server.url) as client:
        ids = [client.upload(make_record(key, time_ms=1.0 + i, config=knobs(i + 1))).record_id
               for i in range(6)]  # fmt: skip

    def dispute(record_id: int) -> int:
        url = f"{server.url}/v1/records/{record_id}/disputes"
        return httpx.post(url, json=dispute_body(key), headers=reader, timeout=30).status_code

    def upload(ms: float) -> int:
        with Client(server.url) as client:
            return client.upload(make_record(key, time_ms=ms, config=knobs(50))).record_id

    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        disputes = [pool.submit(dispute, record_id) for record_id in ids[:3]]
        late = [pool.submit(upload, ms) for ms in (3.5, 2.5)]
    assert [f.result() for f in disputes] == [200, 200, 200]
    with Client(server.url) as client:
        listed = client.list_records(key_hash=key.digest(), limit=100).items
        winner = client.lookup(key, default=DEFAULT)
    assert len(listed) == 8 and sum(r.status == "disputed" for r in listed) == 3
    servable = [r for r in listed if r.status in ("pending", "verified")]
    fastest = min(servable, key=lambda r: (r.timing.median_ms, r.id))
    assert fastest.id == late[1].result()  # 2.5 ms: slower than the disputed, faster than the rest
    assert winner.record is not None and winner.record.id == fastest.id
    assert {r.id for r in listed if r.is_winner} == {fastest.id}


def test_the_cli_creates_a_trusted_verify_token(server: LiveServer, tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "tunecache_cli", "token", "create", "--name",
                           "ci", "--scope", "verify", "--trusted", "--server", server.url],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "'verify' scope, trusted" in done.stderr
    listed = httpx.get(f"{server.url}/v1/tokens", headers=AUTH).json()["items"]
    assert [(t["scope"], t["trusted"]) for t in listed if t["name"] == "ci"] == [("verify", True)]


def test_get_says_why_a_key_with_records_misses(verified_server: LiveServer) -> None:
    import subprocess
    import sys

    from tunecache import key_for

    url = verified_server.url
    key = key_for("matmul", "tvm", {"M": 64, "N": 64, "K": 64}, "float32")  # this machine's
    with Client(url, token=token(url, "laptop", "write")) as client:
        stored = client.upload(make_record(key, config=knobs(1)))
    assert (stored.status, stored.policy) == ("pending", "verified")
    done = subprocess.run([sys.executable, "-m", "tunecache_cli", "get", "matmul", "--backend",
                           "tvm", "--dtype", "float32", "--shape", "M=64,N=64,K=64", "--server",
                           url], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"record #{stored.record_id}: pending: validated by its uploader only" in done.stdout


# -- found by a hostile review -------------------------------------------------------------------
GROUP = {"op": "mm", "inputs": "[x]", "precision": "highest", "timings": {"c-1": 1.0, "c-2": 2.0}}


def test_the_verified_policy_serves_only_trusted_tokens_artifacts(
    verified_server: LiveServer,
) -> None:
    """Artifacts (MetaSchedule records, Inductor choices) have no verifier: under the verified
    policy only a trusted token's are served; an untrusted upload, however fast, never is."""
    url = verified_server.url
    item = {"namespace": "inductor.choices", "partition": "p", "key": "k"}
    with Client(url, token=token(url, "laptop", "write")) as laptop:
        from tunecache.artifacts import ArtifactIn

        said = laptop.put_artifacts([ArtifactIn(**item, value=GROUP, score=1.0)])
        assert said.served is False  # the uploader is told, not left to find out
        assert laptop.get_artifacts("inductor.choices", "p") == []  # pending, never verified
        with Client(url, token=token(url, "ci", "write", trusted=True)) as ci:
            assert ci.put_artifacts([ArtifactIn(**item, value=GROUP, score=1.0)]).served is True
        assert [a.value for a in laptop.get_artifacts("inductor.choices", "p")] == [GROUP]
        faster = {**GROUP, "timings": {"c-1": 0.001, "c-2": 9.0}}
        result = laptop.put_artifacts([ArtifactIn(**item, value=faster, score=0.001)])
        assert (result.stored, result.kept) == (1, 0)  # the laptop's own copy, not served
        assert [a.value for a in laptop.get_artifacts("inductor.choices", "p")] == [GROUP]


def test_uploads_a_verified_server_stores_but_never_serves_are_said_so(
    verified_server: LiveServer, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Under the verified policy ``tune --tvm``, ``tune --torch``, ``import vllm-moe``, the
    TVM database, the Inductor hook and the Triton drop-in said an untrusted token's uploads
    were stored, and nothing more: they are never served (artifacts), or only once a verifier
    passes them (records). Each says so now (here: the TVM database, which stops writing, its
    quota spent for nothing; the clients, the drop-in's too, once; the import; a push of what
    waited in the outbox; the Inductor hook and ``tune --tvm``'s line in tests of their own).
    """
    import shutil

    from tunecache import outbox
    from tunecache.artifacts import UNSERVED_NOTE, ArtifactIn
    from tunecache.triton.shared_client import WrapperClient
    from tunecache.tvm.remote import Remote
    from tunecache_cli import main

    url = verified_server.url
    writer = token(url, "laptop", "write")
    items = [ArtifactIn(namespace="inductor.choices", partition="p", key="k", value=GROUP)]
    remote = Remote(url, writer, 5.0, "p")
    try:
        with caplog.at_level(logging.WARNING, logger="tunecache"):
            assert remote.put(items) is True  # stored
            assert remote.put(items) is False  # not written again
        assert [r.getMessage().count(UNSERVED_NOTE) for r in caplog.records] == [1]
    finally:
        remote.close()
    for client_class in (Client, WrapperClient):  # the drop-in's has an upload_later of its own
        caplog.clear()
        with client_class(url, token=writer) as client, \
                caplog.at_level(logging.WARNING, logger="tunecache"):  # fmt: skip
            for m in (64, 128):
                assert client.upload_later(make_record(make_key(m=m)))
                assert client.drain(30)
        pending = [r.getMessage() for r in caplog.records if "not served" in r.getMessage()]
        assert len(pending) == 1 and "serves verified records only" in pending[0], pending
    folder = tmp_path / "moe"
    shutil.copytree(Path(__file__).parent / "fixtures" / "vllm-moe-configs", folder)
    monkeypatch.setenv("TUNECACHE_TOKEN", writer)
    capsys.readouterr()
    assert main(["import", "vllm-moe", str(folder), "--server", url]) == 0
    assert UNSERVED_NOTE in capsys.readouterr().err
    # an upload a tune left in the outbox, pushed later: its push says so too
    outbox.release(outbox.put(url, make_record(make_key(m=256))))
    outbox.release(outbox.put(url, items))
    assert main(["push", "--server", url]) == 0
    assert "pushed 2 of 2 waiting uploads" in (err := capsys.readouterr().err), err
    assert "2 of them stored but not served: this server serves verified records" in err, err


def test_the_inductor_hook_warns_that_a_verified_server_serves_its_upload_to_no_one(
    verified_server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tunecache.inductor import TeamCacheWarning, _upload
    from tunecache.inductor.remote import TeamCache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # no choice file
    best = {"XBLOCK": 128, "R0_BLOCK": 8, "num_warps": 4, "num_stages": 1,
            "configs_hash": "a" * 64, "found_by_coordesc": False, "time_taken_ms": 12,
            "triton_cache_hash": None}  # fmt: skip
    url = verified_server.url
    for name, trusted in (("laptop", False), ("ci", True)):
        team = TeamCache(url, token(url, name, "write", trusted=trusted), "p", timeout=5.0)
        try:
            with pytest.warns(TeamCacheWarning, match="served to no one") if not trusted \
                    else _no_warning(TeamCacheWarning):  # fmt: skip
                result = _upload(team, {"k" * 60: best})
        finally:
            team.close()
        assert result is not None and (result.stored, result.served) == (1, trusted)


@contextlib.contextmanager
def _no_warning(category: type[Warning]) -> Any:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    assert not [w for w in caught if issubclass(w.category, category)], caught


def test_a_validated_server_says_its_artifacts_are_served(server: LiveServer) -> None:
    from tunecache.artifacts import ArtifactIn

    item = ArtifactIn(namespace="inductor.choices", partition="p", key="k", value=GROUP)
    with Client(server.url) as client:
        assert client.put_artifacts([item]).served is True


def test_an_artifact_the_schemas_refuse_is_never_read_back(server: LiveServer) -> None:
    from tests.factories import store_behind_the_api

    bad = {**GROUP, "timings": {"c-1": -1.0}}
    items = [{"namespace": "inductor.choices", "partition": "p", "key": f"k{i}", "value": v}
             for i, v in enumerate([GROUP, bad])]  # fmt: skip
    assert store_behind_the_api(server.db, items) == 2
    with Client(server.url) as client:
        assert [a.value for a in client.get_artifacts("inductor.choices", "p")] == [GROUP]


def _passed(worker: str, ms: float) -> Any:
    """A verifier's passing finding, its time ``ms``."""
    from tunecache.verification import VerificationCreate

    return VerificationCreate(worker=worker, outcome="passed", device_name="v",
                              timing=make_record(make_key(), time_ms=ms).timing,
                              validation=make_record(make_key()).validation)  # fmt: skip


def _verify(client: Client, record_id: int, worker: str, ms: float) -> RecordPublic:
    task = client.claim_verification(worker, device_arch=CPU.arch, backends=["tvm"])
    assert task is not None and task.record.id == record_id
    return client.submit_verification(record_id, _passed(worker, ms))


def _one_record_and_a_reader(url: str) -> tuple[Key, dict[str, str], int]:
    """A key with one uploaded record, and a consumer's (read token's) headers."""
    key = make_key(m=64)
    reader = {"Authorization": f"Bearer {token(url, 'consumer', 'read')}"}
    with Client(url) as client:
        record_id = client.upload(make_record(key, config=knobs(1))).record_id
    return key, reader, record_id


def test_disputes_after_verifications_are_always_claimable(server: LiveServer) -> None:
    """A record disputed again after three verifications is claimed a fourth time (it does not
    stay out of service for good), and a token's disputes are rate-limited."""
    url = server.url
    key, reader, record_id = _one_record_and_a_reader(url)
    with Client(url, token=token(url, "v", "verify")) as verifier:
        for round_ in range(4):
            answer = post_dispute(url, record_id, reader, dispute_body(key))
            assert answer.json()["status"] == "disputed", answer.text
            assert _verify(verifier, record_id, f"w{round_}", 1.0).status == "verified"
    for _ in range(40):  # 30 a minute by default
        answer = post_dispute(url, record_id, reader, dispute_body(key))
        if answer.status_code == 429:
            break
    assert answer.status_code == 429 and int(answer.headers["retry-after"]) >= 1


def test_a_new_dispute_makes_a_record_whose_attempts_ran_out_claimable_again(
    server: LiveServer,
) -> None:
    """Three verifications that never answered (killed, or a claimer letting its leases lapse)
    used up a disputed record's attempts: another consumer's dispute left it out of service for
    good, unclaimable, where the docs say each new dispute makes it claimable again. The same
    consumer's dispute repeated is not new."""
    url = server.url
    key, reader, record_id = _one_record_and_a_reader(url)
    other = {"Authorization": f"Bearer {token(url, 'consumer-2', 'read')}"}
    assert post_dispute(url, record_id, reader, dispute_body(key)).status_code == 200
    with Client(url, token=token(url, "v", "verify")) as verifier:
        for round_ in range(3):
            task = verifier.claim_verification(f"w{round_}", device_arch=CPU.arch,
                                               backends=["tvm"], lease_seconds=0.001)  # fmt: skip
            assert task is not None and task.record.id == record_id
            time.sleep(0.01)
        claim = {"device_arch": CPU.arch, "backends": ["tvm"], "lease_seconds": 60.0}
        assert verifier.claim_verification("w3", **claim) is None  # its attempts ran out
        assert post_dispute(url, record_id, reader, dispute_body(key)).status_code == 200
        assert verifier.claim_verification("w4", **claim) is None  # the same dispute again
        assert post_dispute(url, record_id, other, dispute_body(key)).status_code == 200
        task = verifier.claim_verification("w5", **claim)
        assert task is not None and task.record.id == record_id
        assert verifier.submit_verification(record_id, _passed("w5", 1.0)).status == "verified"


def test_a_dispute_during_a_verifiers_lease_is_not_settled_unrun(server: LiveServer) -> None:
    url = server.url
    key, reader, record_id = _one_record_and_a_reader(url)
    with Client(url, token=token(url, "v", "verify")) as verifier:
        task = verifier.claim_verification("w1", device_arch=CPU.arch, backends=["tvm"])
        assert task is not None and task.disputed_problems == []
        late = dispute_body(key, {"M": 50, "N": 64, "K": 64})  # in its bucket, never run
        assert post_dispute(url, record_id, reader, late).status_code == 200
        assert verifier.submit_verification(record_id, _passed("w1", 1.0)).status == "disputed"
        again = verifier.claim_verification("w2", device_arch=CPU.arch, backends=["tvm"])
        assert again is not None and again.disputed_problems == [{"M": 50, "N": 64, "K": 64}]


def test_a_verifiers_claim_asked_again_settles_the_disputes_it_was_handed(
    server: LiveServer,
) -> None:
    """A verifier asks for its claim again (the answer lost) after a dispute came in: the task
    it is handed lists that dispute's problem, and its finding settles it (the finding settled
    only the disputes older than the first claim: the record stayed disputed, unserved)."""
    url = server.url
    key, reader, record_id = _one_record_and_a_reader(url)
    with Client(url, token=token(url, "v", "verify")) as verifier:
        first = verifier.claim_verification("w1", device_arch=CPU.arch, backends=["tvm"])
        assert first is not None and first.disputed_problems == []
        late = dispute_body(key, {"M": 50, "N": 64, "K": 64})
        assert post_dispute(url, record_id, reader, late).status_code == 200
        again = verifier.claim_verification("w1", device_arch=CPU.arch, backends=["tvm"])
        assert again is not None and again.record.id == record_id
        assert again.disputed_problems == [{"M": 50, "N": 64, "K": 64}]
        assert verifier.submit_verification(record_id, _passed("w1", 1.0)).status == "verified"


def test_a_lie_about_the_time_stays_flagged_and_no_time_overflows(server: LiveServer) -> None:
    url = server.url
    key = make_key(m=64)
    reader = {"Authorization": f"Bearer {token(url, 'consumer', 'read')}"}
    tiny = make_record(key, config=knobs(1)).model_dump(mode="json", by_alias=True)
    tiny["timing"] = {**tiny["timing"], "median_ms": 5e-324, "min_ms": 5e-324}
    refused = httpx.post(f"{url}/v1/records", json=tiny, headers=AUTH)
    assert refused.status_code == 422 and "timing.m" in refused.json()["detail"]
    with Client(url) as client:
        record_id = client.upload(make_record(key, time_ms=2e-6, config=knobs(1))).record_id
    with Client(url, token=token(url, "v", "verify")) as verifier:
        first = _verify(verifier, record_id, "w1", 1e8)  # a ratio of 5e13: capped, no 500
        assert first.verification is not None and first.verification.time_ratio == 1e9
        assert post_dispute(url, record_id, reader, dispute_body(key)).status_code == 200
        again = _verify(verifier, record_id, "w2", 1.0)
    assert again.verification is not None and again.verification.timing_flag
    assert again.verification.time_ratio == pytest.approx(5e5)  # against the uploaded claim


def test_a_memo_answer_is_verified_before_a_verifying_caller_uses_it(server: LiveServer) -> None:
    key = make_key(m=64)
    with Client(server.url) as client:
        stored = client.upload(make_record(key, config=knobs(4)))
    with Client(server.url, token=token(server.url, "consumer", "read")) as client:
        assert client.lookup(key, default=DEFAULT).source == "server"  # memoised, unverified
        result = client.lookup(key, default=DEFAULT, verify=lambda config: failed_check(key))
        assert (result.source, result.config) == ("default", DEFAULT)
    with Client(server.url) as client:
        assert client.get_record(stored.record_id).status == "disputed"


def test_listings_follow_the_serving_policy(verified_server: LiveServer) -> None:
    url = verified_server.url
    with Client(url, token=token(url, "laptop", "write")) as client:
        pending = client.upload(make_record(make_key(m=64), config=knobs(1)))
        listed = client.list_records(winners_only=True).items
        assert listed == [] and not client.get_record(pending.record_id).is_winner


def test_one_bad_record_does_not_cost_a_snapshot_its_others(tmp_path: Path) -> None:
    import json

    from tunecache.snapshot import SnapshotFilters, render_snapshot

    good, other = make_key(m=64), make_key(m=2048)
    body, _ = render_snapshot(SnapshotFilters(device_arch=CPU.arch),
                              [make_record(good, config=knobs(1)),
                               make_record(other, config=knobs(2))])  # fmt: skip
    document = json.loads(body)
    document["records"][1]["config"] = {"schedule": "knobs", "tile_i": "4; rm -rf /"}
    path = tmp_path / "winners.json"
    path.write_text(json.dumps(document))
    with Client("http://127.0.0.1:9", snapshot=path, timeout=0.2) as client:
        assert client.lookup(good, default=DEFAULT).config == knobs(1)
        assert client.lookup(other, default=DEFAULT).source == "default"


def test_an_integer_output_is_compared_exactly() -> None:
    import torch

    from tunecache.triton.check import compare_outputs

    want = torch.arange(1000, dtype=torch.int32)
    got = want.clone()
    got[-36:] = 0  # a masking bug: the tail never written
    check = compare_outputs([torch.ones(3), got], [torch.ones(3), want], 1e-4, {"n": 1000})
    assert not check.passed and check.note == "36 of 1000 int32 elements differ"
    assert compare_outputs([want.clone()], [want], 1e-4, {"n": 1000}).passed
