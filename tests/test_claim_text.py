"""The API's own words on ``POST /v1/jobs/claim`` match what it does: a repeated claim hands the
held job back without renewing its lease (cache_server.jobs.claim; docs/server.md)."""

from __future__ import annotations

from pathlib import Path

from cache_server.app import create_app
from cache_server.settings import ServerSettings


def test_the_claim_route_does_not_promise_a_renewed_lease(tmp_path: Path) -> None:
    app = create_app(ServerSettings(db=f"sqlite:///{tmp_path / 'cache.db'}"))
    said = " ".join(app.openapi()["paths"]["/v1/jobs/claim"]["post"]["description"].split())
    assert "lease renewed" not in said
    assert "does not renew the lease" in said
