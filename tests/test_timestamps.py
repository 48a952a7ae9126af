"""Every time the API sends carries its zone (UTC), read back from SQLite and PostgreSQL alike."""

from __future__ import annotations

import re

import httpx

from tests.conftest import LiveServer
from tests.factories import AUTH, make_key, make_record
from tunecache.client import Client

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
