"""``tunecache serve --workers N`` logs from every worker as a single-process server does: the
same format, one access line per request carrying its ``X-Request-ID``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import start_server

WORKERS = 2


def _entries(log: Path) -> list[dict[str, Any]]:
    """Every line of the log, each of which must be one JSON object."""
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def test_every_worker_logs_json_access_lines_with_request_ids(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    db = f"sqlite:///{tmp_path / 'cache.db'}"
    args = ["--workers", str(WORKERS), "--log-format", "json"]
    live = start_server(db, tmp_path / "cache.db", log, args=args)
    ids = [f"worker-probe-{n}" for n in range(12)]
    try:
        for rid in ids:  # a new connection each: the kernel spreads them over the workers
            response = httpx.get(f"{live.url}/v1/records", headers={"X-Request-ID": rid},
                                 timeout=10)  # fmt: skip
            assert response.status_code == 200 and response.headers["X-Request-ID"] == rid
        deadline = time.monotonic() + 10  # each worker writes its own lines to the log
        while time.monotonic() < deadline and not all(rid in log.read_text() for rid in ids):
            time.sleep(0.1)
    finally:
        live.stop()
    entries = _entries(log)
    access = [e for e in entries if e["logger"] == "cache_server.access"]
    for rid in ids:
        mine = [e for e in access if e.get("request_id") == rid]
        assert len(mine) == 1, f"{rid}: {mine}"
        assert mine[0]["route"] == "/v1/records" and mine[0]["status"] == 200
        assert mine[0]["level"] == "INFO" and mine[0]["method"] == "GET"
    # Each worker made the set-up: its start-up lines are there, as JSON.
    serving = [e for e in entries if e["logger"] == "cache_server.app"
               and e["message"].startswith("serving ")]  # fmt: skip
    assert len(serving) == WORKERS
    assert not any(e["logger"] == "uvicorn.access" for e in entries)
