"""Every time the API sends carries its zone (UTC), read back from SQLite and PostgreSQL alike."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import httpx
import pytest
from pydantic import ValidationError

from tests.conftest import LiveServer
from tests.factories import AUTH, make_key, make_record
from tunecache.client import Client
from tunecache.schemas import SERVED, RecordPublic
from tunecache_cli.get import describe

ZONED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|\+00:00)$")
FIELDS = {"created_at", "updated_at", "last_used_at", "revoked_at", "lease_expires_at"}


def times(value: object) -> list[str]:
    """Every timestamp field's value anywhere in a JSON document."""
    found: list[str] = []
    if isinstance(value, dict):
        for name, inner in value.items():
            if name in FIELDS and isinstance(inner, str):
                found.append(inner)
            else:
                found += times(inner)
    elif isinstance(value, list):
        for inner in value:
            found += times(inner)
    return found


def test_every_timestamp_read_back_has_a_zone(any_server: LiveServer) -> None:
    url = any_server.url
    with Client(url) as client:
        record = client.upload(make_record(make_key(m=96)))
        client.create_job(make_key(m=128))
        client.claim_job("worker-1")
        revoked = client.create_token("short-lived", "read").info.id
        client.revoke_token(revoked)
    reads = [
        ("GET", "/v1/records", None),
        ("GET", f"/v1/records/{record.record_id}", None),
        ("GET", "/v1/jobs", None),
        ("GET", "/v1/tokens?include_revoked=true", None),
        ("GET", "/v1/whoami", None),
    ]
    seen = []
    for method, path, body in reads:
        response = httpx.request(method, f"{url}{path}", json=body, headers=AUTH, timeout=30)
        assert response.status_code == 200, response.text
        seen += times(response.json())
    assert len(seen) >= 8  # records, jobs (with a lease), tokens (used and revoked)
    assert all(ZONED.match(t) for t in seen), [t for t in seen if not ZONED.match(t)]


SERVED_TIMES = [
    ("2026-01-01T12:00:00+05:00", "2026-01-01 07:00 UTC"),  # a hostile server's zone
    ("2026-01-01T12:00:00", "2026-01-01 12:00 UTC"),  # none: read as UTC
    ("2026-01-01T01:00:00-23:59", "2026-01-02 00:59 UTC"),
]


@pytest.mark.parametrize(("sent", "shown"), SERVED_TIMES)
def test_a_served_time_is_shown_in_utc_whatever_zone_it_came_in(sent: str, shown: str) -> None:
    """`get` labelled a served time "UTC" as sent: another zone's 12:00 read as 12:00 UTC."""
    body = {**make_record(make_key(m=96)).model_dump(mode="json"), "id": 7, "key_hash": "0" * 64,
            "created_at": sent}  # fmt: skip
    record = RecordPublic.model_validate_json(json.dumps(body), context=SERVED)
    assert record.created_at.utcoffset() == timedelta(0)
    assert f"record     #7, {shown}" in describe(record)


def test_a_served_time_out_of_range_in_utc_is_refused() -> None:
    body = {**make_record(make_key(m=96)).model_dump(mode="json"), "id": 7, "key_hash": "0" * 64,
            "created_at": "0001-01-01T00:00:00+01:00"}  # fmt: skip
    with pytest.raises(ValidationError, match="out of range in UTC"):
        RecordPublic.model_validate_json(json.dumps(body), context=SERVED)
