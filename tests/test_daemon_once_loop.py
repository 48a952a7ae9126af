"""``daemon --once`` stops when the server keeps handing back a job it already ran.

A server that handed out the same job on every claim (its retry due at once, or its completion
or failure refused) kept a ``--once`` daemon claiming for as long as it ran: it failed one job
28 times in 120 s, or tuned and uploaded one again on every claim. Now a job handed out again
with no attempt spent since (or after this run completed it) is not run, and the worker stops
claiming; an honest server's retries (an attempt spent on each) still run, three at most.

The server here is a fake at the client's transport: it answers every claim with the same job.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.factories import run_daemon
from tunecache import Client
from tunecache.device import local_device
from tunecache.http import IDENTITY_HEADER
from tunecache.key import Key, key_for
from tuner.daemon import Daemon, DaemonOptions

JOB_ID = 7


def job_json(key: Key, state: str = "running", attempts: int = 1) -> dict[str, Any]:
    now = "2026-01-01T00:00:00Z"
    return {"id": JOB_ID, "key_hash": key.digest(), "key": key.to_json(), "state": state,
            "priority": 0, "source": "api", "attempts": attempts, "max_attempts": 100,
            "lease_owner": "w", "lease_expires_at": now, "error": "", "record_id": None,
            "created_at": now, "updated_at": now}  # fmt: skip


class SameJobServer:
    """Answers every claim with the same job (an attempt spent on each with ``spends``); a
    failure with ``fail_status``."""

    def __init__(self, key: Key, fail_status: int, spends: bool = False) -> None:
        self.key, self.fail_status, self.spends = key, fail_status, spends
        self.claims = 0
        self.fails: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        headers = {IDENTITY_HEADER: "tunecache/test"}
        path = request.url.path
        if path == "/v1/jobs/claim":
            self.claims += 1
            attempts = self.claims if self.spends else 1
            return httpx.Response(200, json=job_json(self.key, attempts=attempts), headers=headers)
        if path == f"/v1/jobs/{JOB_ID}/fail":
            self.fails.append(json.loads(request.content)["error"])
            if self.fail_status != 200:
                body = {"status": self.fail_status, "detail": "refused", "errors": []}
                return httpx.Response(self.fail_status, json=body, headers=headers)
            return httpx.Response(200, json=job_json(self.key, "queued"), headers=headers)
        body = {"status": 404, "detail": f"no {path} here", "errors": []}
        return httpx.Response(404, json=body, headers=headers)


def run_once(server: SameJobServer) -> Daemon:
    """A --once daemon against ``server``, until it stops (or 30 s: still claiming)."""
    options = DaemonOptions(backends=("tvm",), once=True, workers=1, poll_seconds=0.2)
    with Client("http://same-job.test", transport=httpx.MockTransport(server)) as client:
        worker, looping = run_daemon(client, options, timeout=30)
    assert not looping, f"the daemon was still claiming after {server.claims} claims"
    return worker


def user_key() -> Key:
    """A user's kernel from a package the daemon was not given: it fails at once, unimported."""
    key = key_for("matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32")
    return Key(kernel="evilmod:Kernel", source_hash=key.source_hash, backend="tvm",
               problem=key.problem, dtype="float32", device=local_device("cpu").fingerprint)  # fmt: skip


@pytest.mark.parametrize("fail_status", [200, 409], ids=["failure taken", "failure refused"])
def test_a_once_daemon_handed_the_same_job_with_no_attempt_spent_stops(fail_status: int) -> None:
    server = SameJobServer(user_key(), fail_status)
    worker = run_once(server)
    assert server.claims == 2  # run once; handed out again at the same attempt: not run
    assert worker.failed == [JOB_ID] and len(server.fails) == 1
    assert "is not in a package this worker imports" in server.fails[0]


def test_an_honest_retry_runs_again_three_runs_at_most() -> None:
    """A failed job's retry (an attempt spent on each claim) is run again: a --once worker
    ends the run's jobs, retries included; no more than three runs of one."""
    server = SameJobServer(user_key(), 200, spends=True)
    worker = run_once(server)
    assert server.claims == 4 and worker.failed == [JOB_ID] * 3 and len(server.fails) == 3
