"""No one can take the server down from outside: bodies are bounded by who sends them before
they are read, JSON by its shape before it is walked, and every path and query integer is
bounded, on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer
from tests.factories import AUTH, issue_token, make_key
from tunecache.schemas import MAX_ID

JSON = {"Content-Type": "application/json"}
MiB = 2**20


def head_only(url: str, path: str, length: int, headers: dict[str, str]) -> tuple[int, str]:
    """Sends a request's head declaring ``length`` body bytes and none of them; the answer's
    status and body (the server answered without waiting for the body)."""
    host, port = url.removeprefix("http://").split(":")
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {length}",
             "Content-Type: application/json", *(f"{k}: {v}" for k, v in headers.items())]  # fmt: skip
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ")[1])
        while rest.count(b"}") < 1 and (more := conn.recv(65536)):
            rest += more
    return status, rest.decode("latin-1")


def peak_memory_mb(server: LiveServer) -> float:
    """The server process's peak resident memory so far (Linux: VmHWM)."""
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
    return kb / 1024


def test_an_anonymous_body_is_refused_before_it_is_read(server: LiveServer) -> None:
    status, body = head_only(server.url, "/v1/lookup", 16 * MiB, {})
    assert status == 413 and "without a token" in body and "65536" in body, body


def test_a_streamed_anonymous_body_is_cut_at_its_limit(server: LiveServer) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"key": "'
        for _ in range(16 * 16):  # 16 MiB, streamed without a declared length
            yield b"x" * 65536

    answer = httpx.post(f"{server.url}/v1/lookup", content=chunks(), headers=JSON, timeout=30)
    assert answer.status_code == 413 and "without a token" in answer.json()["detail"]


def test_an_unknown_token_is_refused_before_its_body(server: LiveServer) -> None:
    status, body = head_only(server.url, "/v1/records", 8 * MiB,
                             {"Authorization": "Bearer tc_" + "x" * 43})  # fmt: skip
    assert status == 401 and "not known" in body, body


def test_each_scope_has_its_body_limit(server: LiveServer) -> None:
    read = {"Authorization": f"Bearer {issue_token(server.url, 'read')}"}
    status, body = head_only(server.url, "/v1/lookup", 2 * MiB, read)
    assert status == 413 and str(MiB) in body, body
    # Over the anonymous limit, under the read limit: read, then judged on its content.
    padded = {"key": make_key().to_json(), "padding": "x" * 200_000}
    answer = httpx.post(f"{server.url}/v1/lookup", json=padded, headers=read, timeout=30)
    assert answer.status_code == 422 and "padding" in answer.text
    # A write token may send up to the server's maximum.
    status, body = head_only(server.url, "/v1/records", 17 * MiB, AUTH)
    assert status == 413 and str(16 * MiB) in body


def test_a_small_body_that_expands_is_refused_with_bounded_memory(server: LiveServer) -> None:
    """5.5 M empty objects in 16 MiB: 1.5 GB once parsed. Refused before, with a write token."""
    expanding = b"[" + b"{}," * 5_500_000 + b"{}]"
    answer = httpx.post(f"{server.url}/v1/records", content=expanding,
                        headers={**AUTH, **JSON}, timeout=60)  # fmt: skip
    assert answer.status_code == 400, answer.text
    assert "more than 1000000 values" in answer.json()["detail"]
    deep = b"[" * 70 + b"]" * 70
    answer = httpx.post(f"{server.url}/v1/lookup", content=deep, headers=JSON, timeout=30)
    assert answer.status_code == 400 and "nested too deeply" in answer.json()["detail"]
    assert peak_memory_mb(server) < 300
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_parallel_anonymous_floods_leave_the_server_small(server: LiveServer) -> None:
    """16 anonymous 16 MiB bodies at once, streamed: each cut at 64 KiB, the server unharmed."""
    statuses: list[int] = []

    def flood() -> None:
        chunks = (b"[" + b"{}," * 21_845 for _ in range(256))  # ~16 MiB each
        answer = httpx.post(f"{server.url}/v1/lookup", content=chunks, headers=JSON, timeout=60)
        statuses.append(answer.status_code)

    threads = [threading.Thread(target=flood) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [413] * 16
    assert peak_memory_mb(server) < 300
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def out_of_range(schema: dict[str, int]) -> list[int]:
    """Integers just past a parameter's bounds, and past int32, int64 and uint64."""
    low, high = schema["minimum"], schema["maximum"]
    return [high + 1, low - 1, *(v for v in (MAX_ID + 1, 2**63, 2**64, 10**30) if v > high),
            -(2**63) - 1]  # fmt: skip


def test_every_path_and_query_integer_is_bounded(any_server: LiveServer) -> None:
    """Ids past int32 (PostgreSQL's INTEGER) or int64 (SQLite's): 4xx on every route, never
    500; and each integer parameter says its bounds in the OpenAPI document."""
    url = any_server.url
    document = httpx.get(f"{url}/openapi.json", timeout=30).json()
    tried = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                schema = parameter["schema"]
                schema = next((s for s in schema.get("anyOf", [schema]) if s.get("type")), schema)
                if schema.get("type") != "integer":
                    continue
                where = f"{method.upper()} {path} {parameter['name']}"
                assert "maximum" in schema and "minimum" in schema, where
                for value in out_of_range(schema):
                    target, params = path, {}
                    if parameter["in"] == "path":
                        target = path.replace("{" + parameter["name"] + "}", str(value))
                        for other in operation.get("parameters", []):
                            target = target.replace("{" + other["name"] + "}", "1")
                    else:
                        params = {parameter["name"]: str(value)}
                        target = path.replace("{record_id}", "1").replace("{job_id}", "1")
                    body = {} if method in ("post", "put") else None
                    answer = httpx.request(method.upper(), f"{url}{target}", params=params,
                                           json=body, headers=AUTH, timeout=30)  # fmt: skip
                    assert 400 <= answer.status_code < 500, (where, value, answer.text[:200])
                    tried += 1
    assert tried >= 6 * 8, tried  # every id of records, jobs, tokens; limits and offsets
    assert json.loads(httpx.get(f"{url}/health", timeout=30).text)["status"] == "ok"


def test_a_path_id_has_one_spelling(server: LiveServer) -> None:
    """``/v1/records/1.0``, ``+1``, ``01`` and ``1_000`` read as records 1 and 1000, and 5,000
    digits of a job id were a 500 (starlette's ``:int`` ran past Python's digit limit): an id in
    a path is decimal digits only, on every route and the dashboard's record page (422 naming
    the id, never another record's answer)."""
    url = server.url
    document = httpx.get(f"{url}/openapi.json", timeout=30).json()
    targets = [("GET", "/ui/records/{record_id}", "record_id")]
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            targets += [(method.upper(), path, p["name"]) for p in operation.get("parameters", [])
                        if p["in"] == "path"]  # fmt: skip
    assert len(targets) >= 8, targets  # records, disputes, verification, jobs, tokens, the page
    for method, path, name in targets:
        for spelling in ("1.0", "+1", "01", "1_000", "%201", "1%20", "9" * 5000):
            target = path.replace("{" + name + "}", spelling)
            answer = httpx.request(method, f"{url}{target}", json={} if method == "POST" else None,
                                   headers=AUTH, timeout=30)  # fmt: skip
            where = (method, target, answer.status_code, answer.text[:200])
            if answer.status_code == 404:  # a ``:digits`` route: no route matches at all
                assert answer.json()["detail"] == "Not Found", where
            else:
                assert answer.status_code == 422 and name in answer.text, where


def test_an_integral_number_is_the_integer_json_schema_says_it_is(server: LiveServer) -> None:
    """The document says ``integer``, which admits ``64.0``: so does the server, as 64 (the same
    key); ``64.5``, ``true`` and ``"64"`` stay refused."""
    key = make_key().to_json()
    as_float = {**key, "problem": {**key["problem"], "M": 64.0}, "schema": 1.0}
    job = httpx.post(f"{server.url}/v1/jobs", json={"key": as_float, "priority": 3.0},
                     headers=AUTH, timeout=30)  # fmt: skip
    assert job.status_code == 201, job.text
    assert job.json()["job"]["key"]["problem"]["M"] == 64 and job.json()["job"]["priority"] == 3
    assert job.json()["job"]["key_hash"] == make_key().digest()
    for bad in (64.5, True, "64"):
        wrong = {**key, "problem": {**key["problem"], "M": bad}}
        answer = httpx.post(f"{server.url}/v1/lookup", json={"key": wrong}, timeout=30)
        assert answer.status_code == 422, (bad, answer.text)


def test_the_document_states_its_bounds_in_json_schema_terms(server: LiveServer) -> None:
    """Every bound is a JSON Schema keyword (``minimum``, not pydantic's ``ge``), so clients
    and fuzzers generated from the document see it."""
    text = httpx.get(f"{server.url}/openapi.json", timeout=30).text
    for foreign in ('"ge":', '"le":', '"gt":', '"lt":'):
        assert foreign not in text, foreign
    document = json.loads(text)
    reads = document["paths"]["/v1/lookup"]["post"]["security"]
    writes = document["paths"]["/v1/records"]["post"]["security"]
    assert {} in reads and {} not in writes  # open reads: the token is optional there only
    limit = next(p for p in document["paths"]["/v1/records"]["get"]["parameters"]
                 if p["name"] == "limit")  # fmt: skip
    assert limit["schema"]["maximum"] == 1000  # the server's list_limit


def test_a_wrong_method_is_405_with_every_allowed_method(server: LiveServer) -> None:
    claim = httpx.get(f"{server.url}/v1/jobs/claim", headers=AUTH, timeout=30)
    assert claim.status_code == 405 and claim.headers["allow"] == "POST"
    records = httpx.request("OPTIONS", f"{server.url}/v1/records", timeout=30)
    assert records.status_code == 405 and records.headers["allow"] == "GET, POST"
    bogus = httpx.post(f"{server.url}/v1/lookup", json={"key": {}},
                       headers={"Authorization": "Basic dXNlcjpwYXNz"}, timeout=30)  # fmt: skip
    assert bogus.status_code == 401 and "Bearer" in bogus.json()["detail"]


@pytest.fixture
def narrow_server(tmp_path: Path) -> Iterator[LiveServer]:
    """A server that works on one request at a time and waits 50 ms at most for a slot."""
    from tests.conftest import start_server

    env = {"TUNECACHE_SERVER_MAX_IN_FLIGHT": "1", "TUNECACHE_SERVER_MAX_WAIT": "0.05",
           "TUNECACHE_SERVER_BODY_SECONDS": "2", "TUNECACHE_SERVER_RETRY_AFTER": "3"}  # fmt: skip
    live = start_server(f"sqlite:///{tmp_path / 'c.db'}", tmp_path / "c.db",
                        tmp_path / "server.log", env=env)  # fmt: skip
    yield live
    live.stop()


def test_trickled_bodies_hold_no_request_slot(narrow_server: LiveServer) -> None:
    """One request slot; three clients trickle their bodies: lookups are still answered at
    once (a body is read before a slot is taken), and the tricklers are cut at the body
    deadline with 408 and a closed connection."""
    import time

    url = narrow_server.url
    host, port = url.removeprefix("http://").split(":")
    holders = []
    for _ in range(3):
        holder = socket.create_connection((host, int(port)), timeout=10)
        holder.sendall(b"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                       b"\r\nContent-Length: 100\r\n\r\n{")  # fmt: skip
        holders.append(holder)
    time.sleep(0.3)
    for m in (8, 16, 32):
        answer = httpx.post(f"{url}/v1/lookup", json={"key": make_key(m=m).to_json()}, timeout=5)
        assert answer.status_code == 404, answer.text  # a plain miss: answered
    for holder in holders:
        data = b""
        while chunk := holder.recv(4096):  # to the end: the server closes the connection
            data += chunk
        cut = data.decode("latin-1")  # after the 2 s body deadline
        assert cut.startswith("HTTP/1.1 408") and "connection: close" in cut.lower(), cut[:300]
        holder.close()


def test_a_write_the_server_sheds_is_sent_again_within_its_deadline() -> None:
    """503 with Retry-After: the client waits as asked and sends the upload again (within the
    call's deadline); a lookup is never retried (it falls back)."""
    from tests.factories import make_record
    from tunecache import Client
    from tunecache.http import IDENTITY_HEADER, Timeout

    calls: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        headers = {IDENTITY_HEADER: "tunecache/test", "Retry-After": "0.2"}
        if len(calls) == 1 or request.url.path == "/v1/lookup":
            return httpx.Response(503, json={"status": 503, "detail": "busy", "errors": []},
                                  headers=headers)  # fmt: skip
        return httpx.Response(201, json={"record_id": 1, "key_hash": "0" * 64,
                                         "winner_record_id": 1, "is_winner": True,
                                         "status": "pending", "policy": "validated"},
                              headers=headers)  # fmt: skip

    with Client("http://busy.test", transport=httpx.MockTransport(answer),
                timeout=Timeout(lookup=0.5, write=5)) as client:  # fmt: skip
        assert client.upload(make_record()).record_id == 1
        assert calls == ["/v1/records", "/v1/records"]
        assert client.lookup(make_key(), default={"d": 1}).source == "default"
        assert calls.count("/v1/lookup") == 1


def test_one_token_fills_half_a_shape_bucket_and_a_trusted_one_twice_its_limit(
    tmp_path: Path,
) -> None:
    """One write token filled a bucket (4,094 copies under made-up torch versions, one 6 MB
    import) and every other token's new key there was a 409, a team's CI included, until an
    admin withdrew it. A token adds new keys to a bucket while it holds less than half the
    limit there on its word alone (by upload or import); another still adds its own; a trusted
    token's new key is refused only at twice the limit; a new token of a revoked one's name
    holds none of its winners."""
    from tests.conftest import start_server
    from tests.factories import issue_token, make_record
    from tunecache.snapshot import SNAPSHOT_FORMAT

    live = start_server(f"sqlite:///{tmp_path / 'c.db'}", tmp_path / "c.db",
                        tmp_path / "server.log", env={"TUNECACHE_SERVER_BUCKET_WINNERS": "8"})  # fmt: skip
    try:
        url = live.url
        mallory, alice = (issue_token(url, "write") for _ in range(2))
        made = httpx.post(
            f"{url}/v1/tokens",
            json={"name": "ci", "scope": "write", "trusted": True},
            headers=AUTH,
            timeout=30,
        )
        ci = made.json()["token"]

        def upload(token: str, m: int) -> httpx.Response:
            body = make_record(make_key(m)).model_dump(mode="json", by_alias=True)
            return httpx.post(f"{url}/v1/records", json=body, timeout=30,
                              headers={"Authorization": f"Bearer {token}"})  # fmt: skip

        assert [upload(mallory, m).status_code for m in range(65, 69)] == [201] * 4  # M 65..128
        fifth = upload(mallory, 69)
        assert fifth.status_code == 409, fifth.text
        assert "holds 4 winners on this token's word, half" in fifth.json()["detail"]
        document = {"format": SNAPSHOT_FORMAT, "filters": {"device_arch": "cpu-avx2"},
                    "records": [make_record(make_key(70)).model_dump(mode="json", by_alias=True)]}  # fmt: skip
        imported = httpx.post(f"{url}/v1/snapshot", json=document, timeout=30,
                              headers={"Authorization": f"Bearer {mallory}"})  # fmt: skip
        assert imported.status_code == 409 and "on this token's word" in imported.text
        assert [upload(alice, m).status_code for m in (71, 72)] == [201] * 2
        listed = httpx.get(f"{url}/v1/tokens", headers=AUTH, timeout=30).json()["items"]
        (theirs,) = [t for t in listed if t["name"] == "test-write"]  # mallory's
        revoked = httpx.delete(f"{url}/v1/tokens/{theirs['id']}", headers=AUTH, timeout=30)
        assert revoked.status_code == 200, revoked.text
        newcomer = issue_token(url, "write")  # the name freed: given again
        again = [t for t in httpx.get(f"{url}/v1/tokens", headers=AUTH, timeout=30).json()["items"]
                 if t["name"] == "test-write" and t["id"] != theirs["id"]]  # fmt: skip
        assert again, "the revoked token's name was not given again"
        assert upload(newcomer, 73).status_code == 201  # none of mallory's winners are its own
        assert [upload(ci, m).status_code for m in range(74, 83)] == [201] * 9  # 16 in all
        last = upload(ci, 83)
        assert last.status_code == 409 and "twice the server's limit" in last.text, last.text
        full = upload(issue_token(url, "write"), 84)
        assert (
            full.status_code == 409
            and "holds 16 winners, the server's limit of 8 (TUNECACHE_SERVER_BUCKET_WINNERS) or more"
            in full.text
        )
    finally:
        live.stop()


def test_a_full_shape_bucket_takes_no_new_key(tmp_path: Path) -> None:
    """A write token filled one bucket with 20,000 winners (one torch version each) and its
    lookups took 0.7 s instead of 8 ms: a bucket holds ``BUCKET_WINNERS``; a new key beyond is
    a 409 that stores nothing (by upload or import), a key already there still gets a faster
    record, and another bucket is unaffected."""
    from tests.conftest import start_server
    from tests.factories import make_record
    from tunecache.snapshot import SNAPSHOT_FORMAT

    live = start_server(f"sqlite:///{tmp_path / 'c.db'}", tmp_path / "c.db",
                        tmp_path / "server.log", env={"TUNECACHE_SERVER_BUCKET_WINNERS": "3"})  # fmt: skip
    try:
        url = live.url

        def upload(m: int, time_ms: float = 1.0) -> httpx.Response:
            body = make_record(make_key(m), time_ms=time_ms).model_dump(mode="json", by_alias=True)
            return httpx.post(f"{url}/v1/records", json=body, headers=AUTH, timeout=30)

        # bucket M 65..128; an admin's token fills it to twice the limit
        assert [upload(m).status_code for m in range(65, 71)] == [201] * 6
        full = upload(71)
        assert full.status_code == 409 and "holds 6 winners" in full.json()["detail"], full.text
        faster = upload(66, time_ms=0.5)
        assert faster.status_code == 201 and faster.json()["is_winner"]
        assert upload(200).status_code == 201  # another bucket
        document = {"format": SNAPSHOT_FORMAT, "filters": {"device_arch": "cpu-avx2"},
                    "records": [make_record(make_key(72)).model_dump(mode="json", by_alias=True)]}  # fmt: skip
        imported = httpx.post(f"{url}/v1/snapshot", json=document, headers=AUTH, timeout=30)
        assert imported.status_code == 409, imported.text
        assert httpx.get(f"{url}/health", timeout=10).json()["records"] == 8  # none of the 409s
    finally:
        live.stop()
