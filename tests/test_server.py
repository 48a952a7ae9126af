"""The cache server through a real uvicorn process on loopback, over a real SQLite file."""

from __future__ import annotations

import gzip
import json
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import event

from cache_server.embedded import EmbeddedServer
from tests.conftest import LiveServer
from tests.factories import AUTH, make_key, make_record
from tunecache.schemas import LookupResponse, RecordList, RecordPublic, UploadResult


def upload(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/records", json=body, headers=AUTH, timeout=30)


def body_of(record) -> dict:  # type: ignore[no-untyped-def]
    return record.model_dump(mode="json", by_alias=True)


def lookup(url: str, key) -> httpx.Response:  # type: ignore[no-untyped-def]
    return httpx.post(f"{url}/v1/lookup", json={"key": key.to_json()}, timeout=10)


def test_upload_then_lookup_returns_the_record(server: LiveServer) -> None:
    key = make_key()
    response = upload(server.url, body_of(make_record(key, time_ms=2.0, trials=4)))
    assert response.status_code == 201
    result = UploadResult.model_validate(response.json())
    assert result.is_winner and result.key_hash == key.digest()

    hit = lookup(server.url, key)
    assert hit.status_code == 200
    record = LookupResponse.model_validate(hit.json()).record
    assert record.id == result.record_id
    assert record.timing.median_ms == 2.0
    assert record.key.to_key() == key
    assert record.speedup() == pytest.approx(2.0)

    full = RecordPublic.model_validate(
        httpx.get(f"{server.url}/v1/records/{result.record_id}").json()
    )
    assert [t.status for t in full.trials] == ["ok", "ok", "ok", "compile_error"]
    assert full.trials[0].time_ms == 2.0 and full.trials[-1].error == "boom"


def test_an_acknowledged_upload_is_committed_before_the_answer(tmp_path: Path) -> None:
    # Slow every commit down: if the server answered before committing, the record would not be
    # visible to a second connection at the moment the client is told 201.
    with EmbeddedServer(f"sqlite:///{tmp_path / 'slow.db'}") as live:
        assert live.app is not None
        engine = live.app.state.sessionmaker.kw["bind"]
        event.listen(engine, "commit", lambda conn: time.sleep(0.3))
        for m in (1, 2, 3):
            result = upload(live.url, body_of(make_record(make_key(m=m))))
            assert result.status_code == 201
            with sqlite3.connect(tmp_path / "slow.db") as db:
                row = db.execute(
                    "select 1 from records where id = ?", (result.json()["record_id"],)
                )
                assert row.fetchone() is not None


def test_lookup_of_unknown_key_is_404(server: LiveServer) -> None:
    response = lookup(server.url, make_key(m=4096))
    assert response.status_code == 404
    assert make_key(m=4096).digest() in response.json()["detail"]


def test_winner_is_the_fastest_validated_record(server: LiveServer) -> None:
    key = make_key()
    ids = {}
    for ms, passed in [(5.0, True), (2.0, True), (3.0, True), (0.5, False), (2.0, True)]:
        result = UploadResult.model_validate(
            upload(server.url, body_of(make_record(key, time_ms=ms, passed=passed))).json()
        )
        ids.setdefault((ms, passed), result.record_id)
    winner = LookupResponse.model_validate(lookup(server.url, key).json()).record
    # 0.5 ms failed validation and can never win; a tie (second 2.0) does not replace the first.
    assert winner.id == ids[(2.0, True)]
    assert winner.timing.median_ms == 2.0
    with sqlite3.connect(server.db_path) as db:
        assert db.execute("select count(*) from records").fetchone()[0] == 5
        assert db.execute("select count(*) from trials").fetchone()[0] == 15


def test_unvalidated_record_is_stored_but_never_served(server: LiveServer) -> None:
    key = make_key(m=32)
    result = UploadResult.model_validate(
        upload(server.url, body_of(make_record(key, passed=False))).json()
    )
    assert not result.is_winner and result.winner_record_id is None
    assert lookup(server.url, key).status_code == 404
    listed = RecordList.model_validate(
        httpx.get(f"{server.url}/v1/records", params={"validated": "false"}).json()
    )
    assert [r.id for r in listed.items] == [result.record_id]


def test_list_filters(server: LiveServer) -> None:
    for m, kernel, backend in [
        (16, "matmul", "tvm"),
        (32, "matmul", "inductor"),
        (16, "softmax", "tvm"),
    ]:
        assert (
            upload(
                server.url, body_of(make_record(make_key(m, kernel=kernel, backend=backend)))
            ).status_code
            == 201
        )

    def listed(**params: str) -> list[tuple[str, str]]:
        page = RecordList.model_validate(
            httpx.get(f"{server.url}/v1/records", params=params).json()
        )
        return sorted((r.key.kernel, r.key.backend) for r in page.items)

    assert listed(kernel="matmul") == [("matmul", "inductor"), ("matmul", "tvm")]
    assert listed(backend="tvm") == [("matmul", "tvm"), ("softmax", "tvm")]
    assert listed(kernel="softmax", backend="inductor") == []
    assert listed(device_arch="cpu-avx2", winners_only="true") == sorted(
        [("matmul", "inductor"), ("matmul", "tvm"), ("softmax", "tvm")]
    )
    page = RecordList.model_validate(
        httpx.get(f"{server.url}/v1/records", params={"limit": 1}).json()
    )
    assert len(page.items) == 1 and page.count == 3


def test_concurrent_uploads_keep_the_fastest(server: LiveServer) -> None:
    key = make_key(m=8)
    times = [float(t) for t in range(40, 0, -1)] + [0.25]
    with ThreadPoolExecutor(8) as pool:
        codes = list(
            pool.map(
                lambda t: upload(server.url, body_of(make_record(key, time_ms=t))).status_code,
                times,
            )
        )
    assert codes == [201] * len(times)
    winner = LookupResponse.model_validate(lookup(server.url, key).json()).record
    assert winner.timing.median_ms == 0.25


@pytest.mark.parametrize(
    ("content", "status", "reason"),
    [
        (b"{not json", 400, "the body is not valid JSON: body.1: JSON decode error"),
        (b"[]", 422, "valid dictionary"),
        (b'{"key": {}}', 422, "Field required"),
    ],
)
def test_malformed_uploads_are_400_or_422(
    server: LiveServer, content: bytes, status: int, reason: str
) -> None:
    """Not JSON at all: 400, as the API's documentation says (it was a 422); JSON that does not
    validate: 422."""
    response = httpx.post(
        f"{server.url}/v1/records",
        content=content,
        headers={"content-type": "application/json", **AUTH},
    )
    assert response.status_code == status
    assert reason in response.text


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"content-type": "text/plain"}, "Content-Type 'text/plain' is not JSON"),
        ({"content-type": "application/x-www-form-urlencoded"}, "x-www-form-urlencoded"),
        ({}, "no Content-Type"),
        ({"content-type": "application/json", "content-encoding": "gzip"}, "'gzip'"),
    ],
)
def test_a_body_that_is_not_json_is_415_naming_why(
    server: LiveServer, headers: dict[str, str], named: str
) -> None:
    """Each was a 422 that the body "should be a valid dictionary", or (gzip) a 400 that it was
    not UTF-8: neither said what to change."""
    body = json.dumps({"key": make_key().to_json()}).encode()
    content = gzip.compress(body) if "content-encoding" in headers else body
    answer = httpx.post(f"{server.url}/v1/lookup", content=content, headers=headers, timeout=30)
    assert answer.status_code == 415, answer.text
    assert named in answer.json()["detail"]


def test_json_with_parameters_or_a_json_suffix_is_read(server: LiveServer) -> None:
    body = json.dumps({"key": make_key().to_json()}).encode()
    for content_type in ("application/json; charset=utf-8", "application/problem+json"):
        answer = httpx.post(f"{server.url}/v1/lookup", content=body,
                            headers={"content-type": content_type}, timeout=30)  # fmt: skip
        assert answer.status_code == 404, answer.text  # read, and a miss


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32"])
def test_a_body_in_another_unicode_encoding_is_400_not_guessed(
    server: LiveServer, encoding: str
) -> None:
    """``json.loads`` of bytes guessed UTF-16 and UTF-32: such an upload was stored (201)."""
    body = json.dumps(body_of(make_record(make_key(m=40)))).encode(encoding)
    answer = httpx.post(f"{server.url}/v1/records", content=body, timeout=30,
                        headers={**AUTH, "content-type": "application/json"})  # fmt: skip
    assert answer.status_code == 400, answer.text
    assert "not UTF-8" in answer.json()["detail"]
    assert httpx.get(f"{server.url}/v1/records", timeout=30).json()["count"] == 0
    with_bom = b"\xef\xbb\xbf" + json.dumps({"key": make_key().to_json()}).encode()
    answer = httpx.post(f"{server.url}/v1/lookup", content=with_bom, timeout=30,
                        headers={"content-type": "application/json"})  # fmt: skip
    assert answer.status_code == 404, answer.text  # UTF-8 after a byte order mark: read


def test_an_object_naming_a_field_twice_is_400_naming_it(server: LiveServer) -> None:
    """The second ``config`` was stored (201), the first ignored: a proxy or an auditor reading
    the first saw another record than the one stored."""
    record = body_of(make_record(make_key(m=41)))
    rest = {name: value for name, value in record.items() if name != "config"}
    text = json.dumps({"config": {"tile_i": "8; rm -rf /"}, **rest})
    assert text.startswith('{"config": {"tile_i": "8; rm -rf /"}, "key": ')
    text = text.replace('"key": ', f'"config": {json.dumps(record["config"])}, "key": ', 1)
    answer = httpx.post(f"{server.url}/v1/records", content=text.encode(), timeout=30,
                        headers={**AUTH, "content-type": "application/json"})  # fmt: skip
    assert answer.status_code == 400, answer.text
    assert (
        answer.json()["detail"] == "the body is refused: an object names the field 'config' twice"
    )
    assert httpx.get(f"{server.url}/v1/records", timeout=30).json()["count"] == 0


def _mutated(path: list[str | int], value: object) -> dict:
    body = body_of(make_record())
    target = body
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return body


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        (["surprise"], 1, "Extra inputs are not permitted"),
        (["key", "backend"], "cuda-magic", "triton"),
        (["key", "dtype"], "float3", "unknown dtype"),
        (["key", "problem", "M"], -4, "outside"),
        (["key", "problem", "M"], 2**40, "outside"),
        (["timing", "median_ms"], -1.0, "greater than or equal to 0.000001"),
        (["timing", "min_ms"], 100.0, "min_ms <= median_ms"),
        (["validation", "passed"], True, None),  # consistent already: stays valid
        (["validation", "max_rel_error"], 0.3, "worst check"),
        (["trials", 0, "status"], "great", "ok"),
        (["trials", 0, "time_ms"], None, "time_ms exactly when"),
    ],
)
def test_invalid_fields_are_422_with_the_reason(
    server: LiveServer, path: list[str | int], value: object, reason: str | None
) -> None:
    response = upload(server.url, _mutated(path, value))
    if reason is None:
        assert response.status_code == 201
    else:
        assert response.status_code == 422, response.text
        assert reason in response.text


def test_failed_check_cannot_claim_validation(server: LiveServer) -> None:
    body = body_of(make_record(passed=False))
    body["validation"]["passed"] = True
    response = upload(server.url, body)
    assert response.status_code == 422
    assert "a check failed" in response.text


def test_oversized_upload_is_413_and_stores_nothing(server: LiveServer) -> None:
    body = body_of(make_record())
    body["config"] = {"blob": "x" * (17 * 2**20)}
    response = httpx.post(
        f"{server.url}/v1/records", content=json.dumps(body), headers=AUTH, timeout=30
    )
    assert response.status_code == 413
    assert "limit" in response.json()["detail"]
    big_config = body_of(make_record())
    big_config["config"] = {"blob": "x" * (300 * 1024)}
    response = upload(server.url, big_config)
    assert response.status_code == 422 and "config is" in response.text
    assert httpx.get(f"{server.url}/health").json()["records"] == 0


def test_streamed_oversized_upload_is_413(server: LiveServer) -> None:
    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(20):
            yield b"x" * 2**20

    response = httpx.post(f"{server.url}/v1/records", content=chunks(), headers=AUTH, timeout=30)
    assert response.status_code == 413


def test_bad_query_parameters_are_4xx(server: LiveServer) -> None:
    assert httpx.get(f"{server.url}/v1/records", params={"limit": 0}).status_code == 422
    assert httpx.get(f"{server.url}/v1/records", params={"limit": 10**6}).status_code == 422
    assert httpx.get(f"{server.url}/v1/records", params={"backend": "x"}).status_code == 422
    assert httpx.get(f"{server.url}/v1/records", params={"key_hash": "zz"}).status_code == 422
    assert httpx.get(f"{server.url}/v1/records/999").status_code == 404
    assert httpx.get(f"{server.url}/v1/records/abc").status_code == 422


def test_openapi_docs_are_served(server: LiveServer) -> None:
    assert httpx.get(f"{server.url}/docs").status_code == 200
    spec = httpx.get(f"{server.url}/openapi.json").json()
    assert {"/v1/records", "/v1/lookup", "/health"} <= set(spec["paths"])


def test_every_answer_says_its_type_is_not_to_be_sniffed(server: LiveServer) -> None:
    """The API's JSON answers (and /openapi.json) had no ``nosniff``: only the pages did."""
    for path in ("/v1/health", "/openapi.json", "/v1/records?limit=1", "/v1/nothing", "/ui/jobs"):
        answer = httpx.get(f"{server.url}{path}", timeout=30)
        assert answer.headers.get_list("x-content-type-options") == ["nosniff"], path


def test_a_redirect_never_names_the_host_a_request_named(server: LiveServer) -> None:
    """Starlette's trailing-slash redirects were absolute, built from the ``Host`` header:
    ``Host: evil.example`` got ``Location: http://evil.example/v1/records``, an answer a shared
    cache in front would give everyone. They are relative, and still lead where they did."""
    evil = {"Host": "evil.example"}
    for path, to in (("/v1/records/?limit=2", "/v1/records?limit=2"),
                     ("/ui/static", "/ui/static/")):  # fmt: skip
        answer = httpx.get(f"{server.url}{path}", headers=evil, timeout=30)
        assert answer.status_code == 307 and answer.headers["location"] == to, answer.headers
    followed = httpx.get(f"{server.url}/v1/records/", follow_redirects=True, timeout=30)
    assert followed.status_code == 200 and followed.json()["items"] == []


def test_a_probe_asking_with_head_finds_the_server_up(server: LiveServer) -> None:
    """``HEAD /health`` was a 405: a load balancer probing with ``HEAD`` (HAProxy's
    ``option httpchk HEAD``) read a healthy server as down. Other routes keep their methods."""
    head = httpx.head(f"{server.url}/health", timeout=30)
    assert head.status_code == 200 and head.content == b"", head.text
    assert head.headers.get_list("x-content-type-options") == ["nosniff"]
    assert httpx.head(f"{server.url}/v1/records", timeout=30).status_code == 405
    spec = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    assert set(spec["paths"]["/health"]) == {"get"}
