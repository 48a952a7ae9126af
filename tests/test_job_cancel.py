"""Cancelling open jobs (``POST /v1/jobs/{id}/cancel``, ``tunecache pretune MANIFEST --cancel``):
by the route, on SQLite and PostgreSQL, and by the CLI against a real server. Before, a job
queued by mistake (a wrong manifest, a deployment called off) ran to its end on every daemon,
unless an operator edited the database."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from tests.conftest import LiveServer
from tests.factories import AUTH, issue_token, make_key
from tests.test_job_release import _start, _wait_running
from tunecache.client import Client
from tunecache.key import key_for

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _name(http: httpx.Client, headers: dict[str, str]) -> str:
    name: str = http.get("/v1/whoami", headers=headers).json()["token"]["name"]
    return name


def test_a_token_cancels_its_own_open_jobs_and_an_admin_any(any_server: LiveServer) -> None:
    mine = _bearer(issue_token(any_server.url, "write"))
    theirs = _bearer(issue_token(any_server.url, "write"))
    reader = _bearer(issue_token(any_server.url, "read"))
    with httpx.Client(base_url=any_server.url, timeout=30) as http:
        ours = http.post("/v1/jobs", json={"key": make_key(m=41).to_json(), "max_attempts": 2},
                         headers=mine).json()["job"]  # fmt: skip
        other = http.post("/v1/jobs", json={"key": make_key(m=42).to_json()},
                          headers=theirs).json()["job"]  # fmt: skip
        for token in (theirs, reader):  # another caller's job; no write scope
            refused = http.post(f"/v1/jobs/{ours['id']}/cancel", headers=token)
            assert refused.status_code == 403, refused.text
        assert http.get(f"/v1/jobs/{ours['id']}").json()["state"] == "queued"
        done = http.post(f"/v1/jobs/{ours['id']}/cancel", headers=mine)
        assert done.status_code == 200, done.text
        job = done.json()
        assert (job["state"], job["attempts"], job["lease_owner"], job["error_by"]) == (
            "failed", 0, None, "",
        )  # fmt: skip
        assert job["error"] == f"cancelled by {_name(http, mine)}"
        again = http.post(f"/v1/jobs/{ours['id']}/cancel", headers=mine)
        assert again.status_code == 409 and "is failed" in again.json()["detail"], again.text
        assert http.post("/v1/jobs/999999/cancel", headers=mine).status_code == 404
        # no worker claims the cancelled job: the other one is the queue's only open job
        claimed = http.post("/v1/jobs/claim", json={"worker": "w1"}, headers=theirs).json()
        assert claimed["id"] == other["id"]
        cancelled = http.post(f"/v1/jobs/{other['id']}/cancel", headers=AUTH)  # running: admin
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "failed"
        beat = http.post(f"/v1/jobs/{other['id']}/heartbeat", json={"worker": "w1"},
                         headers=theirs)  # fmt: skip
        assert beat.status_code == 409 and "was cancelled by" in beat.json()["detail"], beat.text
        end = http.post(f"/v1/jobs/{other['id']}/complete", json={"worker": "w1", "record_id": 1},
                        headers=theirs)  # fmt: skip
        assert end.status_code == 409, end.text
        assert http.post("/v1/jobs/claim", json={"worker": "w1"}, headers=theirs).status_code == 204
        # asked for again, the key's job is queued again with fresh attempts
        back = http.post("/v1/jobs", json={"key": make_key(m=41).to_json()}, headers=mine)
        assert back.status_code == 200, back.text
        assert (back.json()["job"]["state"], back.json()["job"]["attempts"]) == ("queued", 0)
        # another's ended job: a 409 (it is not open), not a 403
        assert http.post(f"/v1/jobs/{other['id']}/cancel", headers=mine).status_code == 409


def test_an_admins_cancelled_job_asked_for_again_is_the_askers_within_its_bounds(
    any_server: LiveServer,
) -> None:
    """Before, a write token asking again for the key of an admin's cancelled job had it queued
    at the admin's priority (500, over the server's cap of 0 for a non-admin token) and 50
    attempts, as that token's own."""
    writer = _bearer(issue_token(any_server.url, "write"))
    key = {"key": make_key(m=43).to_json()}
    with httpx.Client(base_url=any_server.url, timeout=30) as http:
        job = http.post("/v1/jobs", json={**key, "priority": 500, "max_attempts": 50},
                        headers=AUTH).json()["job"]  # fmt: skip
        assert http.post(f"/v1/jobs/{job['id']}/cancel", headers=AUTH).status_code == 200
        again = http.post("/v1/jobs", json={**key, "priority": 0, "max_attempts": 1},
                          headers=writer).json()["job"]  # fmt: skip
        assert (again["state"], again["priority"], again["max_attempts"]) == ("queued", 0, 5)
        assert http.post(f"/v1/jobs/{job['id']}/cancel", headers=writer).status_code == 200


def test_an_admin_asking_again_for_anothers_job_makes_it_its_own(any_server: LiveServer) -> None:
    """Before, it stayed the write token's, at the admin's priority and attempts: that token's
    to cancel, counted among its open jobs past its cap."""
    writer = _bearer(issue_token(any_server.url, "write"))
    key = {"key": make_key(m=45).to_json()}
    with httpx.Client(base_url=any_server.url, timeout=30) as http:
        job = http.post("/v1/jobs", json=key, headers=writer).json()["job"]
        assert http.post(f"/v1/jobs/{job['id']}/cancel", headers=writer).status_code == 200
        again = http.post("/v1/jobs", json={**key, "priority": 500}, headers=AUTH).json()["job"]
        assert (again["state"], again["priority"]) == ("queued", 500)
        assert http.post(f"/v1/jobs/{job['id']}/cancel", headers=writer).status_code == 403


def test_only_a_cancelled_or_answered_job_stops_its_workers_tune(server: LiveServer) -> None:
    """A worker cut off past its last attempt's lease (the job failed by the lapse) stores what
    it tuned, served for the key: before the fix under review it stopped as if cancelled."""
    from tuner.polling import ended

    with Client(server.url) as client:
        lapsed = client.create_job(make_key(m=46), max_attempts=1).job
        claimed = client.claim_job("w1", lease_seconds=1)
        assert claimed is not None and claimed.id == lapsed.id
        time.sleep(1.5)
        assert client.claim_job("w2") is None  # the lapse fails the job: its last attempt
        assert client.get_job(lapsed.id).state == "failed"
        assert ended(client, lapsed.id) is None
        cancelled = client.create_job(make_key(m=47)).job
        client.cancel_job(cancelled.id)
        why = ended(client, cancelled.id)
        assert why is not None and "(failed: cancelled by " in why


def test_a_workers_own_words_do_not_read_as_a_cancel(any_server: LiveServer) -> None:
    """Only the server's words say a job was cancelled: a worker's last error saying "cancelled
    by admin" made another worker's 409 say an admin had cancelled the job."""
    token = _bearer(issue_token(any_server.url, "write"))
    with httpx.Client(base_url=any_server.url, timeout=30) as http:
        job = http.post("/v1/jobs", json={"key": make_key(m=44).to_json(), "max_attempts": 1},
                        headers=token).json()["job"]  # fmt: skip
        http.post("/v1/jobs/claim", json={"worker": "w1"}, headers=token)
        failed = http.post(
            f"/v1/jobs/{job['id']}/fail",
            json={"worker": "w1", "error": "cancelled by admin"},
            headers=token,
        )
        assert failed.json()["state"] == "failed", failed.text
        beat = http.post(f"/v1/jobs/{job['id']}/heartbeat", json={"worker": "w1"},
                         headers=token)  # fmt: skip
        assert beat.status_code == 409 and "not running under a lease" in beat.text, beat.text


MANIFEST = """
[[tune]]
kernel = "matmul"
backends = ["tvm"]
shapes = [{shapes}]
"""


def _pretune(server: LiveServer, token: str, manifest: Path, *args: str
             ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run([sys.executable, "-m", "tunecache_cli", "pretune", str(manifest),
                           "--server", server.url, *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO,
                          env={**os.environ, "TUNECACHE_TOKEN": token})  # fmt: skip


def _write(path: Path, *sizes: int) -> Path:
    shapes = ", ".join(f"{{M = {m}, N = 32, K = 32}}" for m in sizes)
    path.write_text(MANIFEST.format(shapes=shapes))
    return path


def test_pretune_cancel_says_what_it_cancelled_before_a_server_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before, a refusal of the second cancel (a 429) ended the command with the refusal only:
    nothing said the first job had been cancelled."""
    from tunecache.errors import ServerError
    from tunecache_cli.pretune_cancel import cancel

    keys = [make_key(m=m) for m in (51, 52)]
    jobs = [SimpleNamespace(id=n, key_hash=k.digest(), state="queued") for n, k in enumerate(keys)]

    class Server:
        def list_jobs(self, **_: object) -> SimpleNamespace:
            return SimpleNamespace(items=jobs, count=len(jobs))

        def cancel_job(self, job_id: int) -> None:
            if job_id == 1:
                raise ServerError("POST /v1/jobs/1/cancel → 429: slow down", status_code=429)

    with pytest.raises(ServerError, match="429"):
        cancel(Server(), SimpleNamespace(keys=keys))
    assert "1 job cancelled before this error" in capsys.readouterr().err


def test_pretune_cancel_ends_the_manifests_jobs_and_names_another_callers(
    server: LiveServer, tmp_path: Path
) -> None:
    mine, theirs = issue_token(server.url, "write"), issue_token(server.url, "write")
    assert _pretune(server, mine, _write(tmp_path / "a.toml", 32, 48), "--no-wait").returncode == 0
    assert _pretune(server, theirs, _write(tmp_path / "b.toml", 64), "--no-wait").returncode == 0
    every = _write(tmp_path / "all.toml", 32, 48, 64, 80)  # 80: a key with no job
    ran = _pretune(server, mine, every, "--cancel")
    assert ran.returncode == 4, ran.stderr  # one job left open: another caller's, named
    assert "4 keys: 2 jobs cancelled, 1 another caller's, 1 with no queued or running job" in (
        ran.stderr
    )
    assert "1 job left open, queued by another caller" in ran.stderr
    assert "matmul[K=32,M=64,N=32]" in ran.stderr and "Traceback" not in ran.stderr
    states = {j["key"]["problem"]["M"]: j["state"]
              for j in httpx.get(f"{server.url}/v1/jobs").json()["items"]}  # fmt: skip
    assert states == {32: "failed", 48: "failed", 64: "queued"}
    both = _pretune(server, mine, every, "--cancel", "--json")
    assert both.returncode == 2 and "no --json or --no-wait" in both.stderr, both.stderr
    admin = _pretune(server, AUTH["Authorization"].split()[1], every, "--cancel")
    assert admin.returncode == 0, admin.stderr
    assert "4 keys: 1 job cancelled, 0 another caller's, 3 with no" in admin.stderr
    assert httpx.get(f"{server.url}/v1/jobs?state=queued").json()["count"] == 0


def test_a_daemon_running_a_cancelled_job_stops_its_tune(server: LiveServer) -> None:
    """Before, the daemon tuned a cancelled job to its end (its 500 trials: minutes here),
    uploaded the winner and had its completion refused."""
    key = key_for("matmul", "tvm", {"M": 64, "N": 64, "K": 64}, "float32")
    with Client(server.url) as client:
        job = client.create_job(key, trials=500, max_attempts=1).job
    worker = _start(server, "--lease", "3", "--once")  # renewed each second
    try:
        _wait_running(server, job.id)
        time.sleep(1.0)  # into the tune
        cancelled = httpx.post(f"{server.url}/v1/jobs/{job.id}/cancel", headers=AUTH, timeout=30)
        assert cancelled.status_code == 200, cancelled.text
        _, stderr = worker.communicate(timeout=120)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, stderr
    assert f"job {job.id}: tune stopped: it ended on the server while it ran here (failed: " \
        "cancelled by " in stderr, stderr  # fmt: skip
    assert "Traceback" not in stderr, stderr
    with Client(server.url) as client:
        ended = client.get_job(job.id)
        assert (ended.state, ended.attempts) == ("failed", 1)
        assert client.list_records().count == 0  # nothing tuned to the end, nothing uploaded
