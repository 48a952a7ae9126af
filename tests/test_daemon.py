"""The tuning daemon against a real server: it claims only what it can run, tunes, uploads,
completes; failures are given back with their reason; a client's miss becomes a hit."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import LiveServer
from tests.factories import make_key
from tunecache import Client, Device, DeviceFingerprint, DeviceLimits, key_for
from tunecache.device import local_device

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
H100 = Device(DeviceFingerprint(kind="cuda", arch="sm_90", name="h100-80gb-hbm3", units=132),
              DeviceLimits.H100)  # fmt: skip


def daemon(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunecache.cli", "daemon", "--once",
                           "--server", server.url, "--trials", "2", "--workers", "1", *args],
                          capture_output=True, text=True, timeout=900, cwd=REPO)  # fmt: skip


def test_the_daemon_tunes_what_it_can_run_and_a_miss_becomes_a_hit(server: LiveServer) -> None:
    missed = key_for("matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32")
    queued = key_for("softmax", "inductor", {"M": 8, "N": 48}, "float32")
    elsewhere = key_for("matmul", "triton", {"M": 16, "N": 16, "K": 16}, "float16", device=H100)
    broken = dataclasses.replace(make_key(), kernel="tests.no_such_module:Gone",
                                 device=local_device("cpu").fingerprint)  # fmt: skip
    with Client(server.url, report_misses=True) as client:
        assert client.lookup(missed).source == "default"  # the miss is reported: a job
    with Client(server.url) as client:
        client.create_job(queued)
        client.create_job(elsewhere)  # another arch and a GPU backend: never for this daemon
        client.create_job(broken, max_attempts=1)

    done = daemon(server)
    assert done.returncode == 0, done.stderr
    assert "2 jobs completed, 1 failed" in done.stderr

    with Client(server.url) as client:
        jobs = {job.key.kernel + "/" + job.key.backend: job for job in client.list_jobs().items}
        hit = client.lookup(missed)
        records = client.list_records().items
    assert {k: j.state for k, j in jobs.items()} == {
        "matmul/tvm": "done", "softmax/inductor": "done", "matmul/triton": "queued",
        "tests.no_such_module:Gone/tvm": "failed",
    }  # fmt: skip
    assert jobs["matmul/triton"].attempts == 0  # never claimed
    assert "cannot import 'tests.no_such_module'" in jobs["tests.no_such_module:Gone/tvm"].error
    assert (hit.source, hit.rule) == ("server", "exact")  # the miss, tuned by the daemon
    assert len(records) == 2 and all(r.validation.passed for r in records)
    assert {jobs["matmul/tvm"].record_id, jobs["softmax/inductor"].record_id} == {
        r.id for r in records
    }


def test_the_daemon_refuses_to_start_without_a_write_token(server: LiveServer) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k != "TUNECACHE_TOKEN"}
    done = subprocess.run([sys.executable, "-m", "tunecache.cli", "daemon", "--once", "--server",
                           server.url], capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 2 and "'write' scope" in done.stderr
