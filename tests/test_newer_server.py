"""A client reads a newer server's answers: fields it does not know are left out, not refused.

A server adds fields to its answers as it grows (a record's status, a timing's conditions, a
job's budget). A client whose models refused unknown fields took every lookup answer of a newer
server for a broken server: each hit became the default config and the server was skipped for
30 s; an upload the server had stored raised. Here the server is one we own at the client's
transport, answering as a newer server would: our own answers plus fields of its own, at every
level.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest

from tests.factories import make_key, make_record, miss
from tunecache import Client
from tunecache.http import IDENTITY_HEADER
from tunecache.key import Key
from tunecache.schemas import LookupRequest, RecordCreate
from tunecache.snapshot import SNAPSHOT_FORMAT, load_snapshot

NEWER = {IDENTITY_HEADER: "tunecache/9.0.0"}


def _grown(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` (a stored record's JSON) with fields a newer server might add, at each level."""
    return {
        **record,
        "lineage": {"parent": 3},
        "timing": {**record["timing"], "clock_source": "tsc", "cycles": 2**70},  # past int64
        "key": {**record["key"], "device": {**record["key"]["device"], "pcie_gen": 5}},
        "validation": {**record["validation"], "seeds": [1, 2]},
    }


def _stored(key: Key) -> dict[str, Any]:
    data = make_record(key).model_dump(mode="json", by_alias=True)
    return {**data, "id": 7, "key_hash": key.digest(), "created_at": "2026-01-01T00:00:00Z"}


def _newer_server() -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/lookup":
            key = LookupRequest.model_validate_json(request.content).key.to_key()
            body = {"record": _grown(_stored(key)), "match": "exact", "policy": "strict",
                    "served_by": "replica-2"}  # fmt: skip
            return httpx.Response(200, content=json.dumps(body).encode(), headers=NEWER)
        if request.url.path == "/v1/records" and request.method == "POST":
            body = {"record_id": 7, "key_hash": "0" * 64, "winner_record_id": 7,
                    "is_winner": True, "status": "pending", "policy": "validated",
                    "queued_verification": True}  # fmt: skip
            return httpx.Response(201, json=body, headers=NEWER)
        return miss()

    return httpx.MockTransport(handle)


def test_a_newer_servers_hit_is_a_hit(caplog: pytest.LogCaptureFixture) -> None:
    key = make_key(m=48)
    newer = Client("http://newer.test", transport=_newer_server())
    with caplog.at_level(logging.WARNING, logger="tunecache"), newer as client:
        found = client.lookup(key, default={"d": 1})
        again = client.lookup(make_key(m=96), default={"d": 1})
    assert found.source == "server" and found.config == make_record(key).config
    assert again.source == "server"  # the server was not skipped as broken
    assert found.record is not None and found.record.id == 7
    assert caplog.records == []


def test_an_upload_a_newer_server_stored_says_so() -> None:
    with Client("http://newer.test", transport=_newer_server(), token="tc_" + "a" * 43) as client:
        result = client.upload(make_record(make_key(m=48)))
    assert (result.record_id, result.is_winner, result.status) == (7, True, "pending")


def test_a_snapshot_file_a_newer_version_wrote_is_read(tmp_path: Any) -> None:
    key = make_key(m=48)
    record = _grown(make_record(key).model_dump(mode="json", by_alias=True))
    document = {"format": SNAPSHOT_FORMAT, "filters": {"device_arch": key.device.arch},
                "records": [record], "signed_by": "ci"}  # fmt: skip
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(document))
    snapshot = load_snapshot(path)
    assert [r.config for r in snapshot.records] == [make_record(key).config]


def test_an_upload_leaves_out_what_an_older_server_need_not_hear_of() -> None:
    """A server older than ``timing.noisy`` or a trial's ``times_ms`` refused every upload
    that sent them, at their defaults too: an upload sends only what differs from them, and
    means the same record."""
    sent: list[dict[str, Any]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        body = {"record_id": 7, "key_hash": "0" * 64, "winner_record_id": 7, "is_winner": True}
        return httpx.Response(201, json=body, headers=NEWER)

    record = make_record(make_key(m=48))
    assert not record.timing.noisy and all(not t.times_ms for t in record.trials)
    with Client("http://older.test", transport=httpx.MockTransport(handle),
                token="tc_" + "a" * 43) as client:  # fmt: skip
        client.upload(record)
    (body,) = sent
    assert "noisy" not in body["timing"] and all("times_ms" not in t for t in body["trials"])
    assert RecordCreate.model_validate(body) == record
    # what a default means is still said: a later server may change a default, not the meaning
    assert body["key"]["schema"] == 1 and body["timing"]["timer"] == record.timing.timer
    assert body["validation"]["reference"] == record.validation.reference
