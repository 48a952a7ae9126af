"""``daemon --once`` stops when the server keeps handing back a job it already ended.

A server that handed out the same job on every claim (its retry due at once, or its completion
or failure refused) kept a ``--once`` daemon claiming for as long as it ran: it failed one job
28 times in 120 s, or tuned and uploaded one again on every claim. Now a job this run already
failed or completed is given back unrun when it comes back, and the worker stops claiming when
it comes back after that.

The server here is a fake at the client's transport: it answers every claim with the same job.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest

from tunecache import Client
from tunecache.device import local_device
from tunecache.http import IDENTITY_HEADER
from tunecache.key import Key, key_for
from tuner.daemon import Daemon, DaemonOptions

JOB_ID = 7


def job_json(key: Key, state: str = "running") -> dict[str, Any]:
    now = "2026-01-01T00:00:00Z"
    return {"id": JOB_ID, "key_hash": key.digest(), "key": key.to_json(), "state": state,
            "priority": 0, "source": "api", "attempts": 1, "max_attempts": 100,
            "lease_owner": "w", "lease_expires_at": now, "error": "", "record_id": None,
            "created_at": now, "updated_at": now}  # fmt: skip


class SameJobServer:
    """Answers every claim with the same job; a failure with ``fail_status``."""

    def __init__(self, key: Key, fail_status: int) -> None:
        self.key, self.fail_status = key, fail_status
        self.claims = 0
        self.fails: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        headers = {IDENTITY_HEADER: "tunecache/test"}
        path = request.url.path
        if path == "/v1/jobs/claim":
            self.claims += 1
            return httpx.Response(200, json=job_json(self.key), headers=headers)
        if path == f"/v1/jobs/{JOB_ID}/fail":
            self.fails.append(json.loads(request.content)["error"])
            if self.fail_status != 200:
                body = {"status": self.fail_status, "detail": "refused", "errors": []}
                return httpx.Response(self.fail_status, json=body, headers=headers)
            return httpx.Response(200, json=job_json(self.key, "queued"), headers=headers)
        body = {"status": 404, "detail": f"no {path} here", "errors": []}
        return httpx.Response(404, json=body, headers=headers)


@pytest.mark.parametrize("fail_status", [200, 409], ids=["failure taken", "failure refused"])
def test_a_once_daemon_handed_the_same_failing_job_again_and_again_stops(
    fail_status: int,
) -> None:
    # A user's kernel from a package this daemon was not given: it fails at once, unimported.
    key = key_for("matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32")
    key = Key(kernel="evilmod:Kernel", source_hash=key.source_hash, backend="tvm",
              problem=key.problem, dtype="float32", device=local_device("cpu").fingerprint)  # fmt: skip
    server = SameJobServer(key, fail_status)
    options = DaemonOptions(backends=("tvm",), once=True, workers=1, poll_seconds=0.2)
    with Client("http://same-job.test", transport=httpx.MockTransport(server)) as client:
        worker = Daemon(client, options)
        runner = threading.Thread(target=worker.run, daemon=True)
        runner.start()
        runner.join(timeout=30)
        looping = runner.is_alive()
        worker.stop()
        runner.join(timeout=30)
    assert not looping, f"the daemon was still claiming after {server.claims} claims"
    assert server.claims == 3  # worked once, given back unrun once, then no more claims
    assert worker.failed == [JOB_ID] * 3  # each claim's lease given back
    assert "is not in a package this worker imports" in server.fails[0]
    for again in server.fails[1:]:  # unrun, saying what this run did with it
        assert again.startswith("TuningError: not run again by this --once worker, which "
                                "failed it (InvalidInput: kernel 'evilmod:Kernel' is not in a "
                                "package"), again  # fmt: skip
