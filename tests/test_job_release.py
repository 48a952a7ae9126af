"""A job given back with its attempt unfinished (``POST /v1/jobs/{id}/release``): by the route,
on SQLite and PostgreSQL, and by a real daemon stopped mid-job with Ctrl-C or a second SIGTERM.
Before, a stopped daemon's job waited out its lease, and on its last attempt failed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer
from tests.factories import AUTH, issue_token, make_key
from tunecache.client import Client
from tunecache.key import key_for

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def _release(http: httpx.Client, job_id: int, worker: str, token: dict[str, str]) -> httpx.Response:
    return http.post(f"/v1/jobs/{job_id}/release", json={"worker": worker}, headers=token)


def test_a_lease_given_back_is_queued_again_its_attempt_refunded(any_server: LiveServer) -> None:
    url = any_server.url
    mine = {"Authorization": f"Bearer {issue_token(url, 'write')}"}
    theirs = {"Authorization": f"Bearer {issue_token(url, 'write')}"}
    reader = {"Authorization": f"Bearer {issue_token(url, 'read')}"}
    with httpx.Client(base_url=url, timeout=30) as http:
        made = http.post("/v1/jobs", json={"key": make_key(m=31).to_json(), "max_attempts": 1},
                         headers=mine)  # fmt: skip
        assert made.status_code == 201, made.text
        job = http.post("/v1/jobs/claim", json={"worker": "w1"}, headers=mine).json()
        assert job["attempts"] == 1
        for token in (theirs, reader):  # another's lease (its worker's name is public); no write
            refused = _release(http, job["id"], "w1", token)
            assert refused.status_code in (403, 409), refused.text
        assert _release(http, job["id"], "w2", mine).status_code == 409  # not that worker's
        assert http.get(f"/v1/jobs/{job['id']}").json()["state"] == "running"
        back = _release(http, job["id"], "w1", mine)
        assert back.status_code == 200, back.text
        given = back.json()
        assert (given["state"], given["attempts"], given["lease_owner"]) == ("queued", 0, None)
        assert _release(http, job["id"], "w1", mine).status_code == 409  # no longer held
        # claimable at once, its one attempt still to run (a lapsed lease had failed it)
        again = http.post("/v1/jobs/claim", json={"worker": "w3"}, headers=theirs).json()
        assert (again["id"], again["attempts"]) == (job["id"], 1)
        assert _release(http, job["id"], "w3", AUTH).status_code == 200  # an admin: any lease
        assert http.get(f"/v1/jobs/{job['id']}").json()["state"] == "queued"
        bad = http.post(f"/v1/jobs/{job['id']}/release", json={"worker": ""}, headers=mine)
        assert bad.status_code == 422


def _start(server: LiveServer, *args: str, ctrl_c: object = signal.default_int_handler
           ) -> subprocess.Popen[str]:  # fmt: skip
    """A daemon with Python's own SIGINT handler (or ``ctrl_c``), whatever this process has (a
    background job of a script inherits SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, ctrl_c)  # type: ignore[arg-type]
    try:
        return subprocess.Popen([sys.executable, "-m", "tunecache_cli", "daemon", "--server",
                                 server.url, "--workers", "1", "--backends", "tvm", *args],
                                cwd=REPO, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)


def _wait_running(server: LiveServer, job_id: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if httpx.get(f"{server.url}/v1/jobs/{job_id}").json()["state"] == "running":
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} never started running")


@pytest.mark.parametrize("signals", [(signal.SIGINT,), (signal.SIGTERM, signal.SIGTERM)],
                         ids=["ctrl-c", "sigterm-twice"])  # fmt: skip
def test_a_daemon_stopped_mid_job_gives_it_back(
    server: LiveServer, signals: tuple[signal.Signals, ...]
) -> None:
    key = key_for("matmul", "tvm", {"M": 64, "N": 64, "K": 64}, "float32")
    with Client(server.url) as client:
        job = client.create_job(key, trials=500, max_attempts=1).job
    worker = _start(server, "--lease", "600")
    assert worker.stderr is not None
    lines: list[str] = []
    try:
        _wait_running(server, job.id)
        time.sleep(1.0)  # into the tune
        for sent in signals:
            worker.send_signal(sent)
            if sent == signal.SIGTERM and len(signals) > 1:  # taken, before the next (else one)
                while "SIGTERM: stopping once the current work is done" not in "".join(lines):
                    lines.append(worker.stderr.readline())
                    assert lines[-1], "".join(lines)
        _, stderr = worker.communicate(timeout=120)
        stderr = "".join(lines) + stderr
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, stderr
    assert "Traceback" not in stderr and f"job {job.id}: stopped mid-way: given back" in stderr, (
        stderr
    )
    assert "0 jobs completed" in stderr, stderr
    with Client(server.url) as client:
        (back,) = client.list_jobs().items
    assert (back.id, back.state, back.attempts, back.lease_owner) == (job.id, "queued", 0, None)


def test_where_ctrl_c_is_ignored_a_second_sigterm_says_it_cannot_stop_at_once(
    server: LiveServer,
) -> None:
    """A daemon started as a script's background job (SIGINT ignored) had a second SIGTERM raise
    inside TVM's search: the process crashed (a segfault), its job left leased. It says why it
    cannot stop at once, and goes on."""
    key = key_for("matmul", "tvm", {"M": 64, "N": 64, "K": 64}, "float32")
    with Client(server.url) as client:
        job = client.create_job(key, trials=500).job
    worker = _start(server, "--lease", "600", ctrl_c=signal.SIG_IGN)
    assert worker.stderr is not None
    lines: list[str] = []
    try:
        _wait_running(server, job.id)
        time.sleep(1.0)  # into the tune
        for said in ("(Ctrl-C is ignored here: no sooner)", "so it cannot stop at once"):
            worker.send_signal(signal.SIGTERM)
            while said not in "".join(lines):
                lines.append(worker.stderr.readline())
                assert lines[-1], "".join(lines)
        time.sleep(2.0)
        assert worker.poll() is None, "".join(lines)  # still tuning: not crashed
    finally:
        worker.kill()
        lines.append(worker.communicate()[1])
    assert "Segfault" not in "".join(lines)
