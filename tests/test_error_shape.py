"""One error shape for every 4xx and 5xx, and every status a route answers with in its document.

Against a real server on loopback (SQLite): requests that provoke each error status the API has
— an unparsable body (400), no token or an unknown one (401), too small a scope (403), a missing
thing (404), a conflict (409), a body over the limit (413), a body that is not JSON (415), a
request that does not validate and one the server refuses for a reason of its own (422), too many
miss reports (429) — each answer is JSON that validates against the ``ErrorBody`` schema of the
server's own ``/openapi.json``, repeats its status, and the status is documented on that
operation with that schema.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from tests.conftest import LiveServer, start_server
from tests.factories import AUTH, make_key

MAX_BODY = 4096


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("errors")
    env = {"TUNECACHE_SERVER_MAX_BODY": str(MAX_BODY),
           "TUNECACHE_SERVER_MISS_REPORTS_PER_MINUTE": "1"}  # fmt: skip
    server = start_server(f"sqlite:///{tmp / 'c.db'}", tmp / "c.db", tmp / "log", env=env)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def document(live: LiveServer) -> dict[str, Any]:
    spec: dict[str, Any] = httpx.get(f"{live.url}/openapi.json", timeout=30).json()
    return spec


def _reader(url: str) -> dict[str, str]:
    answer = httpx.post(f"{url}/v1/tokens", json={"name": "reader", "scope": "read"},
                        headers=AUTH, timeout=30)  # fmt: skip
    assert answer.status_code == 201, answer.text
    return {"Authorization": f"Bearer {answer.json()['token']}"}


def _provoke(url: str) -> Iterator[tuple[str, str, int, httpx.Response]]:
    """``(method, path template, expected status, answer)`` for every error status."""
    http = httpx.Client(base_url=url, timeout=30)
    key = make_key(m=77).to_json()
    yield (
        "POST",
        "/v1/lookup",
        400,
        http.post(
            "/v1/lookup",
            content=b'{"key": "\xff"}',
            headers={**AUTH, "content-type": "application/json"},
        ),
    )
    for broken in (b"{", b'{"key": 1,}', b"[1, 2"):  # not JSON at all: 400 too (it was a 422)
        yield (
            "POST",
            "/v1/lookup",
            400,
            http.post(
                "/v1/lookup", content=broken, headers={**AUTH, "content-type": "application/json"}
            ),
        )
    yield "POST", "/v1/records", 401, http.post("/v1/records", json={})
    yield (
        "GET",
        "/v1/tokens",
        401,
        http.get("/v1/tokens", headers={"Authorization": "Bearer tc_not_a_token"}),
    )
    yield "POST", "/v1/records", 403, http.post("/v1/records", json={}, headers=_reader(url))
    yield "GET", "/v1/records/{record_id}", 404, http.get("/v1/records/999", headers=AUTH)
    yield "POST", "/v1/lookup", 404, http.post("/v1/lookup", json={"key": key}, headers=AUTH)
    yield "DELETE", "/v1/tokens/{token_id}", 409, http.delete("/v1/tokens/1", headers=AUTH)
    yield (
        "POST",
        "/v1/records",
        413,
        http.post(
            "/v1/records",
            content=b"x" * (MAX_BODY + 1),
            headers={**AUTH, "content-type": "application/json"},
        ),
    )
    yield (
        "POST",
        "/v1/lookup",
        415,
        http.post("/v1/lookup", content=b"{}", headers={**AUTH, "content-type": "text/plain"}),
    )
    yield "POST", "/v1/lookup", 422, http.post("/v1/lookup", json={}, headers=AUTH)
    yield "GET", "/v1/records", 422, http.get("/v1/records?limit=1001", headers=AUTH)
    yield "POST", "/v1/jobs/{job_id}/complete", 409, _complete_with_no_record(http, key)
    http.post("/v1/misses", json={"key": make_key(m=78).to_json()}, headers=AUTH)
    yield (
        "POST",
        "/v1/misses",
        429,
        http.post("/v1/misses", json={"key": make_key(m=79).to_json()}, headers=AUTH),
    )
    http.close()


def _complete_with_no_record(http: httpx.Client, key: dict[str, Any]) -> httpx.Response:
    created = http.post("/v1/jobs", json={"key": key}, headers=AUTH)
    assert created.status_code == 201, created.text
    claimed = http.post(
        "/v1/jobs/claim",
        json={"worker": "w", "device_arch": key["device"]["arch"], "backends": [key["backend"]]},
        headers=AUTH,
    )
    assert claimed.status_code == 200, claimed.text
    job = claimed.json()
    return http.post(
        f"/v1/jobs/{job['id']}/complete",
        json={"worker": "w", "record_id": 999},
        headers=AUTH,
    )


def test_every_error_answer_has_the_one_documented_shape(
    live: LiveServer, document: dict[str, Any]
) -> None:
    error_schema = {**document["components"]["schemas"]["ErrorBody"],
                    "$defs": document["components"]["schemas"]}  # fmt: skip
    validator = jsonschema.Draft202012Validator(
        _local_refs(error_schema), format_checker=jsonschema.FormatChecker()
    )
    seen = set()
    for method, path, status, answer in _provoke(live.url):
        where = f"{method} {path} → {answer.status_code} {answer.text[:300]}"
        assert answer.status_code == status, where
        assert answer.headers["content-type"] == "application/json", where
        body = answer.json()
        validator.validate(body)
        assert body["status"] == status and body["detail"].strip(), where
        documented = document["paths"][path][method.lower()]["responses"]
        assert str(status) in documented, f"{where}: not documented"
        ref = documented[str(status)]["content"]["application/json"]["schema"]["$ref"]
        assert ref == "#/components/schemas/ErrorBody", where
        seen.add(status)
    assert seen == {400, 401, 403, 404, 409, 413, 415, 422, 429}


def _local_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """The document's ``#/components/schemas/X`` refs as refs into ``$defs``."""
    import json

    text = json.dumps(schema).replace("#/components/schemas/", "#/$defs/")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def test_validation_and_refusal_422s_share_the_shape(live: LiveServer) -> None:
    """Once two shapes under one status: a list of errors, or a string."""
    invalid = httpx.post(f"{live.url}/v1/lookup", json={"key": {"kernel": 5}}, headers=AUTH,
                         timeout=30).json()  # fmt: skip
    refused = httpx.get(f"{live.url}/v1/records?limit=1001", headers=AUTH, timeout=30).json()
    assert set(invalid) == set(refused) == {"status", "detail", "errors"}
    assert isinstance(invalid["detail"], str) and "body.key" in invalid["detail"]
    assert invalid["errors"] and all(set(e) == {"loc", "msg", "type"} for e in invalid["errors"])
    assert refused["detail"] == "limit 1001 is over the server's maximum of 1000"
    assert refused["errors"] == []


def test_a_refusal_422_logs_no_deprecation_warning(server: LiveServer, tmp_path: Path) -> None:
    """The first refusal a route raised itself logged Starlette's warning that the name of its
    status (``HTTP_422_UNPROCESSABLE_ENTITY``) is deprecated, in every server's log."""
    refused = httpx.get(f"{server.url}/v1/records?limit=1001", headers=AUTH, timeout=30)
    assert refused.status_code == 422
    assert "is over the server's maximum" in refused.json()["detail"]
    deadline = time.monotonic() + 30
    while "GET /v1/records 422" not in (log := (tmp_path / "server.log").read_text()):
        assert time.monotonic() < deadline, log  # its access line, written after the answer
        time.sleep(0.05)
    assert "Deprecat" not in log, log


def test_the_document_names_every_status_an_operation_can_answer(document: dict) -> None:
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            where = f"{method.upper()} {path}: {sorted(codes)}"
            assert "500" in codes, where
            if operation.get("security"):
                assert {"401", "403"} <= codes, where
            if "requestBody" in operation:
                assert {"400", "413", "415", "422"} <= codes, where
            if operation.get("parameters"):
                assert "422" in codes, where
    assert "HTTPValidationError" not in document["components"]["schemas"]
    assert "409" in document["paths"]["/v1/tokens/{token_id}"]["delete"]["responses"]
    assert "429" in document["paths"]["/v1/misses"]["post"]["responses"]


def test_an_unknown_path_and_a_wrong_method_answer_in_the_shape(live: LiveServer) -> None:
    for answer, status in ((httpx.get(f"{live.url}/v1/nothing", timeout=30), 404),
                           (httpx.put(f"{live.url}/v1/records", timeout=30), 405)):  # fmt: skip
        assert answer.status_code == status
        assert answer.json()["status"] == status and answer.json()["errors"] == []


def test_the_client_reads_the_detail(tmp_path: Path, live: LiveServer) -> None:
    from tunecache.client import Client
    from tunecache.errors import ServerError

    with Client(live.url, token="tc_not_a_token") as client, pytest.raises(ServerError) as err:
        client.upload(_record())
    assert err.value.status_code == 401 and "not known to this server" in str(err.value)


def _record() -> Any:
    from tests.factories import make_record

    return make_record(make_key(m=80))


def test_links_name_the_resources_answers_make(document: dict) -> None:
    """A generated client (or a stateful fuzzer) can follow an upload to its record, a claim to
    the job's heartbeat, a new token to its revocation."""
    ids = {op["operationId"] for ops in document["paths"].values() for op in ops.values()}
    uploaded = document["paths"]["/v1/records"]["post"]["responses"]["201"]["links"]
    assert uploaded["GetRecord"]["parameters"] == {"record_id": "$response.body#/record_id"}
    claimed = document["paths"]["/v1/jobs/claim"]["post"]["responses"]["200"]["links"]
    assert set(claimed) == {"Heartbeat", "Complete", "Fail"}
    made = document["paths"]["/v1/tokens"]["post"]["responses"]["201"]["links"]
    for link in (*uploaded.values(), *claimed.values(), *made.values()):
        assert link["operationId"] in ids


@pytest.fixture
def default_server(tmp_path: Path) -> Iterator[LiveServer]:
    """A server with the default limits (this module's other server takes 4 KiB bodies)."""
    server = start_server(f"sqlite:///{tmp_path / 'c.db'}", tmp_path / "c.db", tmp_path / "log")
    yield server
    server.stop()


def test_a_422_lists_a_bounded_number_of_fields_and_counts_them_all(
    default_server: LiveServer,
) -> None:
    """A body without a token whose mapping holds 4,000 entries of the wrong type, one keyed by
    a long name: the answer lists the first 20 fields, each part of its place cut short, and
    its detail counts every one (it was 4,000 errors, 419 KB, for a 63 KB body)."""
    url = default_server.url
    key = make_key().to_json()
    key["environment"] = {f"e{i}": ["x"] for i in range(4000)}
    answer = httpx.post(f"{url}/v1/lookup", json={"key": key}, timeout=30)
    assert answer.status_code == 422, answer.text[:300]
    found = answer.json()
    assert len(found["errors"]) == 20, len(found["errors"])
    more = re.search(r"and (\d+) more", found["detail"])
    assert more is not None and int(more.group(1)) >= 4000 - 3, found["detail"]
    assert len(answer.content) < 8 * 2**10, len(answer.content)
    key["environment"] = {"n" * 5000: ["x"]}
    answer = httpx.post(f"{url}/v1/lookup", json={"key": key}, timeout=30)
    assert answer.status_code == 422, answer.text[:300]
    places = [part for e in answer.json()["errors"] for part in e["loc"]]
    assert any(str(p).startswith("nnn") for p in places), places
    assert all(len(str(p)) <= 64 for p in places), [len(str(p)) for p in places]
