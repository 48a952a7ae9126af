"""The tuning daemon against a real server: it claims only what it can run, tunes, uploads,
completes; failures are given back with their reason; a client's miss becomes a hit."""

from __future__ import annotations

import dataclasses
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.factories import claimed_job, make_key, run_daemon
from tunecache import Client, Device, DeviceFingerprint, DeviceLimits, key_for
from tunecache.device import local_device
from tunecache.errors import ServerError, SourcesChanged
from tunecache.http import IDENTITY_HEADER
from tuner.daemon import Daemon, DaemonOptions

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
H100 = Device(DeviceFingerprint(kind="cuda", arch="sm_90", name="h100-80gb-hbm3", units=132),
              DeviceLimits.H100)  # fmt: skip


def daemon(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunecache_cli", "daemon", "--once",
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
        client.create_job(broken, max_attempts=2)

    done = daemon(server, "--kernels", "tests")  # it may import tests.*: the import fails
    assert done.returncode == 1, done.stderr  # --once, and a job failed
    assert "2 jobs completed, 2 failed" in done.stderr  # the broken job: retried, then failed

    with Client(server.url) as client:
        jobs = {job.key.kernel + "/" + job.key.backend: job for job in client.list_jobs().items}
        hit = client.lookup(missed)
        records = client.list_records().items
    assert {k: j.state for k, j in jobs.items()} == {
        "matmul/tvm": "done", "softmax/inductor": "done", "matmul/triton": "queued",
        "tests.no_such_module:Gone/tvm": "failed",
    }  # fmt: skip
    assert jobs["matmul/triton"].attempts == 0  # never claimed
    assert jobs["tests.no_such_module:Gone/tvm"].attempts == 2  # up to its limit
    assert "cannot import 'tests.no_such_module'" in jobs["tests.no_such_module:Gone/tvm"].error
    assert (hit.source, hit.rule) == ("server", "exact")  # the miss, tuned by the daemon
    assert len(records) == 2 and all(r.validation.passed for r in records)
    assert {jobs["matmul/tvm"].record_id, jobs["softmax/inductor"].record_id} == {
        r.id for r in records
    }


def test_a_job_of_another_kernel_version_is_left_to_a_worker_of_that_version(
    server: LiveServer,
) -> None:
    """A job queued by a process of another version of the kernel (or of tunecache, for a
    built-in): a record of this daemon's version would be served to none of the processes that
    asked. It failed such jobs, an attempt each (a fleet half upgraded failed the new version's
    jobs). A claim now names the versions this daemon runs: a built-in's job of another version
    is never handed to it, and the daemon says why it waits; a user's kernel's version is known
    once a job imported it, so one job of another version fails (saying why, untuned) and the
    next is left alone."""
    here = key_for("matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32")
    affine = key_for("tests.user_kernels:AffineRows", "tvm", {"M": 8, "N": 24}, "float32")
    others = [dataclasses.replace(k, source_hash="0" * 16) for k in (here, affine)]
    second = dataclasses.replace(others[1], problem={"M": 16, "N": 24})
    # (the first in a dtype this version does not take: its version is known all the same)
    others[1] = dataclasses.replace(others[1], dtype="float16")
    with Client(server.url) as client:
        for key in (*others, second):
            client.create_job(key, max_attempts=1)
    done = daemon(server, "--kernels", "tests")
    assert done.returncode == 1 and "0 jobs completed, 1 failed" in done.stderr, done.stderr
    said = [line for line in done.stderr.splitlines() if "they wait for a worker" in line]
    assert len(said) == 1, done.stderr
    assert "of matmul, tests.user_kernels:AffineRows are for another version" in said[0]
    with Client(server.url) as client:
        jobs = {(j.key.kernel, j.key.problem["M"]): j for j in client.list_jobs().items}
        assert client.list_records().items == []
    failed = jobs["tests.user_kernels:AffineRows", 8]
    assert failed.state == "failed" and failed.attempts == 1
    assert f"source hashes {affine.source_hash} here, the job's {'0' * 16}" in failed.error
    waiting = [jobs["matmul", 16], jobs["tests.user_kernels:AffineRows", 16]]
    assert [(j.state, j.attempts) for j in waiting] == [("queued", 0)] * 2


def _pulled_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> Path:
    """A package ``name`` of tests/user_kernels.py's kernels, importable here (and in the
    processes a harness spawns); returns its kernels' file."""
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "kernels.py").write_text((REPO / "tests" / "user_kernels.py").read_text())
    monkeypatch.syspath_prepend(str(tmp_path))
    return package / "kernels.py"


def test_a_daemon_whose_kernels_change_on_disk_stops_before_its_next_claim(
    server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pull under a running daemon: the processes its harness starts import the new code,
    which it tuned under the version it had read, and the records were served to processes of
    that version, never checked with their code. It stops before claiming, saying why."""
    kernels = _pulled_package(tmp_path, monkeypatch, "pulledpkg")
    source = kernels.read_text()
    name = "pulledpkg.kernels:AffineRows"
    with Client(server.url) as client:
        daemon = Daemon(client, DaemonOptions(once=True, kernels=("pulledpkg",)))
        arch = daemon.arch()
        key = key_for(name, "tvm", {"M": 8, "N": 24}, "float32")
        assert daemon.local_key(claimed_job(key)) == key  # its version read, and named
        assert daemon.claim(arch) is None  # nothing queued, nothing changed
        kernels.write_text(source + "\n# pulled\n")
        with pytest.raises(SourcesChanged, match=r"pulledpkg.kernels:AffineRows's sources for tvm "
                           r"changed on disk since this daemon read them .*restart it"):  # fmt: skip
            daemon.claim(arch)


def test_a_job_tuned_while_its_kernel_changed_on_disk_is_failed_not_uploaded(
    server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A pull lands while a job tunes (an hour's job, a claim's millisecond): its record would
    be uploaded under the version the daemon had read. The job is failed, nothing uploaded, and
    the daemon stops at its next claim, saying it stopped (it said "tuning failed" where an idle
    daemon was stopped so)."""
    import tuner.daemon
    from tunecache_cli import main

    kernels = _pulled_package(tmp_path, monkeypatch, "midpullpkg")
    key = key_for("midpullpkg.kernels:AffineRows", "tvm", {"M": 8, "N": 24}, "float32")
    tune = tuner.daemon.tune

    def tune_then_pull(*args: Any, **kwargs: Any) -> Any:
        outcome = tune(*args, **kwargs)
        kernels.write_text(kernels.read_text() + "\n# pulled\n")
        return outcome

    monkeypatch.setattr(tuner.daemon, "tune", tune_then_pull)
    with Client(server.url) as client:
        client.create_job(key)
    code = main(["daemon", "--once", "--server", server.url, "--kernels", "midpullpkg",
                 "--trials", "2", "--workers", "1"])  # fmt: skip
    said = capsys.readouterr().err
    assert code == 1 and "tuning failed" not in said, said
    assert ("tunecache: stopped: midpullpkg.kernels:AffineRows's sources for tvm changed on "
            "disk since this daemon read them") in said, said  # fmt: skip
    with Client(server.url) as client:
        (job,) = client.list_jobs().items
        assert client.list_records().items == []
    assert job.state == "queued" and job.attempts == 1, job  # failed, to be retried
    assert "changed on disk" in job.error


def test_a_job_never_makes_the_daemon_import_a_package_it_was_not_given(
    server: LiveServer, tmp_path: Path
) -> None:
    """Anyone who may report a miss can queue a job naming any ``module:Class``: a daemon claims
    only jobs whose kernels come from the packages its operator named (--kernels), so such a job
    waits, unclaimed and unimported, for a daemon that may import it."""
    marker = tmp_path / "imported"
    (tmp_path / "evilmod.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    job = dataclasses.replace(make_key(), kernel="evilmod:Kernel",
                              device=local_device("cpu").fingerprint)  # fmt: skip
    # named by whoever queued them: never offered as a --kernels (a standard library module
    # that runs code when imported; a module like __main__, which no worker imports)
    odd = [dataclasses.replace(job, kernel=k) for k in ("antigravity:K", "otherpkg.__main__:K")]
    with Client(server.url) as client:
        client.create_job(job, max_attempts=1)
        for other in odd:
            client.create_job(other, max_attempts=1)
    done = subprocess.run([sys.executable, "-m", "tunecache_cli", "daemon", "--once", "--server",
                           server.url, "--workers", "1", "--kernels", "mypkg,mypkg.sub"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "0 jobs completed, 0 failed" in done.stderr
    # said once, the package named, never imported (it idled saying only "0 jobs completed")
    said = [line for line in done.stderr.splitlines() if "wait for kernels" in line]
    assert len(said) == 1 and "such as evilmod:Kernel; --kernels evilmod takes them" in said[0], (
        said
    )
    assert "for packages you trust" in said[0] and "antigravity" not in said[0], said
    assert "__main__" not in said[0], said
    # it takes the job's backend: the package kept the job from it
    assert re.search(r": taking \S*tvm\S* jobs for ", done.stderr), done.stderr
    assert not marker.exists()  # neither the job's module nor the allowed package (found only)
    with Client(server.url) as client:
        waiting = client.list_jobs().items
    assert {(j.state, j.attempts) for j in waiting} == {("queued", 0)} and len(waiting) == 3


def test_a_daemon_given_a_package_it_cannot_import_does_not_start(server: LiveServer) -> None:
    done = daemon(server, "--kernels", "tests,no_such_package_here")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == ("tunecache: error: --kernels: kernel package "
                                   "'no_such_package_here' cannot be imported here (not "
                                   "installed, and not in the current directory)")  # fmt: skip
    done = daemon(server, "--kernels", "tests.,a..b")  # names no claim may carry
    assert done.returncode == 2 and "expected at most 64 dotted package names" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_daemon_refuses_to_start_without_a_write_token(server: LiveServer) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k != "TUNECACHE_TOKEN"}
    done = subprocess.run([sys.executable, "-m", "tunecache_cli", "daemon", "--once", "--server",
                           server.url], capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 2 and "'write' scope" in done.stderr


@pytest.mark.parametrize(("given", "said"), [
    (["--strategy", "bogus"], "--strategy: unknown strategy 'bogus' for "),
    (["--strategy", "bayes"], "inductor has no space to search with 'bayes'; its search is "
                              "'inductor_max_autotune' (--backends tvm: those it can tune)"),
    (["--strategy", "meta_schedule", "--backends", "tvm,inductor"], "(--backends tvm: those"),
    # it said "no backend installed here runs on cpu", where TVM and Inductor do
    (["--backends", "triton"], "--backends triton: none of them runs on cpu here (those that "
                               "do: tvm, inductor)"),
])  # fmt: skip
def test_a_strategy_the_daemon_cannot_tune_with_is_refused_before_it_claims(
    server: LiveServer, given: list[str], said: str
) -> None:
    """A mistyped ``--strategy`` was said by the first job claimed: failed, an attempt of a
    team's job spent (and the job held back by the retry delay)."""
    with Client(server.url) as client:
        job = client.create_job(make_key(m=96)).job
    done = daemon(server, *given)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    listed = httpx.get(f"{server.url}/v1/jobs").json()["items"]
    assert [(j["id"], j["state"], j["attempts"]) for j in listed] == [(job.id, "queued", 0)]


def _start(server: LiveServer, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tunecache_cli", "daemon", "--server",
                             server.url, "--workers", "1", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def _wait_running(server: LiveServer, timeout: float = 120.0) -> dict:  # type: ignore[type-arg]
    import time

    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = httpx.get(f"{server.url}/v1/jobs", params={"state": "running"}).json()["items"]
        if running:
            return running[0]  # type: ignore[no-any-return]
        time.sleep(0.2)
    raise AssertionError("no job started running")


def test_a_killed_daemons_job_is_reclaimed_after_its_lease_and_finished(
    server: LiveServer,
) -> None:
    import signal
    import time

    key = key_for("matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32")
    with Client(server.url) as client:
        job = client.create_job(key).job
    first = _start(server, "--trials", "16", "--lease", "3")
    held = _wait_running(server)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    time.sleep(3.5)  # the lease expires: the job is claimable again
    second = daemon(server, "--lease", "30")
    assert second.returncode == 0 and "1 job completed" in second.stderr, second.stderr
    with Client(server.url) as client:
        finished = client.list_jobs().items[0]
    assert finished.id == job.id and finished.state == "done" and finished.attempts == 2
    assert finished.lease_owner != held["lease_owner"] and finished.record_id is not None


def test_sigterm_lets_the_current_job_finish(server: LiveServer) -> None:
    import signal

    key = key_for("softmax", "inductor", {"M": 8, "N": 48}, "float32")
    with Client(server.url) as client:
        client.create_job(key)
    worker = _start(server, "--trials", "2")
    _wait_running(server)
    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=300)
    assert worker.returncode == 0 and "1 job completed" in stderr, stderr
    with Client(server.url) as client:
        (job,) = client.list_jobs().items
    assert job.state == "done" and job.attempts == 1  # finished, not lost


class FailRecorder:
    """What a daemon that refuses a job asks of its client, at a boundary we own: the jobs it
    failed and why."""

    def __init__(self) -> None:
        self.failed: list[tuple[int, str]] = []

    def fail_job(self, job_id: int, worker: str, error: str) -> None:
        self.failed.append((job_id, error))


def test_a_daemon_refuses_a_job_for_a_package_it_was_not_given_whoever_hands_it_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server filters claims by package, but a daemon trusts no server (an old one, or a
    hostile one): a job naming another package's kernel is failed unimported."""
    from tuner.daemon import Daemon, DaemonOptions

    marker = tmp_path / "imported"
    (tmp_path / "evilmod.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    key = dataclasses.replace(make_key(), kernel="evilmod:Kernel",
                              device=local_device("cpu").fingerprint)  # fmt: skip
    job = claimed_job(key)

    server = FailRecorder()
    daemon = Daemon(server, DaemonOptions(kernels=("mypkg",)))  # type: ignore[arg-type]
    daemon.work(job, harness=None)  # type: ignore[arg-type]
    assert not marker.exists()
    assert daemon.failed == [7] and len(server.failed) == 1
    assert (
        "'evilmod:Kernel' is not in a package this worker imports (--kernels: mypkg)"
        in (server.failed[0][1])
    )


@pytest.mark.parametrize("module", ["mypkg.__main__", "mypkg.tools.__main__", "mypkg.__init__"])
def test_a_daemon_imports_no_main_module_of_a_package_it_was_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    """``--kernels mypkg`` let anyone who can queue a job (or report a miss) pick which of its
    modules the daemon imports: its ``__main__`` (the package's command line) ran at import."""
    from tuner.daemon import Daemon, DaemonOptions

    marker = tmp_path / "imported"
    folder = tmp_path / Path(*module.split(".")[:-1])
    folder.mkdir(parents=True, exist_ok=True)
    for package in [tmp_path / "mypkg", folder]:
        (package / "__init__.py").write_text("")
    (folder / f"{module.split('.')[-1]}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    key = dataclasses.replace(make_key(), kernel=f"{module}:Kernel",
                              device=local_device("cpu").fingerprint)  # fmt: skip

    server = FailRecorder()
    daemon = Daemon(server, DaemonOptions(kernels=("mypkg",)))  # type: ignore[arg-type]
    daemon.work(claimed_job(key), harness=None)  # type: ignore[arg-type]
    assert not marker.exists()
    assert daemon.failed == [7] and len(server.failed) == 1
    assert (
        f"is in {module!r}: a worker imports no module named like __main__" in (server.failed[0][1])
    )


@pytest.mark.parametrize(("change", "said"), [
    ({"arch": "sm_90"}, "the server handed a job for sm_90; this worker claimed jobs for "),
    ({"backend": "triton"}, "the server handed a job for the triton backend; this worker "),
    ({"m": 24}, "a key this worker did not ask for (pretune --local)"),
])  # fmt: skip
def test_a_daemon_runs_no_job_its_claim_did_not_ask_for(
    change: dict[str, Any], said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim names this machine's arch, its backends and (``pretune --local``) its keys; a
    server (an old or hostile one) that answers with another's was tuned for: the whole search
    run, its record keyed by this machine answering no job (an honest server then refused the
    completion, the attempt spent). It is failed before anything runs, saying why."""
    from tuner import daemon as daemon_module
    from tuner.daemon import Daemon, DaemonOptions
    from tuner.handed import unasked

    ran: list[Any] = []
    monkeypatch.setattr(daemon_module, "tune", lambda *args, **kwargs: ran.append(args))
    here = local_device("cpu").fingerprint
    asked = dataclasses.replace(make_key(m=16), device=here)
    arch = change.get("arch", here.arch)
    key = dataclasses.replace(make_key(m=change.get("m", 16)),
                              device=dataclasses.replace(here, arch=arch),
                              backend=change.get("backend", asked.backend))  # fmt: skip
    server = FailRecorder()
    options = DaemonOptions(backends=(asked.backend,), key_hashes=(asked.digest(),))
    daemon = Daemon(server, options)  # type: ignore[arg-type]
    assert daemon.arch() == here.arch and daemon.backends == (asked.backend,)
    assert unasked(claimed_job(asked), *(here.arch, daemon.backends, options.key_hashes)) is None
    daemon.work(claimed_job(key), harness=None)  # type: ignore[arg-type]
    assert ran == [] and daemon.failed == [7]
    assert said in server.failed[0][1], server.failed


@pytest.mark.parametrize(("field", "value"), [("trials", -1), ("strategy", "x" * 65)])
def test_a_job_a_worker_could_not_run_is_a_bad_answer_not_a_crash(field: str, value: Any) -> None:
    """A hostile (or older) server's claim answer with a budget or strategy no job can be queued
    with: the daemon stops on the server's bad answer, naming it, before anything runs."""
    key = key_for("matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32")
    job = {"id": 1, "key_hash": key.digest(), "key": key.to_json(), "state": "running",
           "priority": 0, "source": "api", "attempts": 1, "max_attempts": 3,
           "lease_owner": "me", "lease_expires_at": None, "error": "", "record_id": None,
           "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
           field: value}  # fmt: skip

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=job, headers={IDENTITY_HEADER: "tunecache/test"})

    with Client("http://hostile.test", transport=httpx.MockTransport(handle)) as client:
        worker = Daemon(client, DaemonOptions(backends=("tvm",), once=True, workers=1))
        with pytest.raises(ServerError, match=f"/v1/jobs/claim gave a bad answer: .*{field}"):
            worker.run()
    assert worker.done == [] and worker.failed == []


def test_a_daemon_outlives_a_server_restart_and_its_record_is_not_lost(tmp_path: Path) -> None:
    """The server stops while a job is being tuned: the daemon died at its next call (exit 3),
    and the record, tuned for as long as the job took, was lost. Now the record waits, the
    daemon asks again, backing off, and once the server is back sends it and completes the job."""
    import signal
    import threading
    import time

    from tests.conftest import start_server

    db_path = tmp_path / "cache.db"
    server = start_server(f"sqlite:///{db_path}", db_path, tmp_path / "server.log")
    port = int(server.url.rsplit(":", 1)[1])
    key = key_for("matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32")
    with Client(server.url) as client:
        job = client.create_job(key).job
    worker = _start(server, "--trials", "4", "--poll", "0.2")
    lines: list[str] = []
    stream = worker.stderr
    assert stream is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(stream.readline, "")))
    reader.start()
    try:
        _wait_running(server)
        server.stop()  # mid-tune
        deadline = time.monotonic() + 300
        while not any("the record waits" in line for line in lines):
            assert worker.poll() is None, "".join(lines)[-3000:]
            assert time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.2)
        time.sleep(1.5)  # a few claims go unanswered: the daemon waits longer each time
        server = start_server(f"sqlite:///{db_path}", db_path, tmp_path / "server.log", port=port)
        deadline = time.monotonic() + 120
        while (done := client_job(server, job.id)).state != "done":
            assert time.monotonic() < deadline and worker.poll() is None, "".join(lines)[-3000:]
            time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        reader.join(timeout=10)
        server.stop()
    said = "".join(lines)
    assert worker.returncode == 0 and "1 job completed" in said, said[-3000:]
    assert said.count("WARNING tuner.daemon: the server does not answer") == 1, said
    # each line of a log that runs for days says when (it said only what)
    stamped = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} (INFO|WARNING) tuner\.daemon: "
    logged = [line for line in said.splitlines() if " tuner.daemon: " in line]
    assert logged and all(re.match(stamped, line) for line in logged), logged
    assert said.count("the server answers again") == 1, said
    assert done.record_id is not None and done.attempts == 1  # completed, not redone


def client_job(server: LiveServer, job_id: int) -> Any:
    with Client(server.url) as client:
        return next(j for j in client.list_jobs().items if j.id == job_id)


def test_polling_backs_off_while_the_server_is_away_and_stops_on_a_refusal() -> None:
    """Unanswered claims are asked again, each wait twice the last up to a minute (or what the
    server asked for); a refusal that asking again cannot change (a revoked token) ends it, as
    does any failure with ``once``."""
    import threading

    from tuner.polling import MAX_BACKOFF, poll

    class Clock(threading.Event):
        waits: list[float] = []

        def wait(self, timeout: float | None = None) -> bool:
            self.waits.append(float(timeout or 0))
            if len(self.waits) == 9:
                self.set()
            return self.is_set()

    down = ServerError("connection refused")
    down.__cause__ = httpx.ConnectError("refused")
    answers: list[Any] = [down] * 6 + [ServerError("busy", status_code=503,
                                                   retry_after=90)] + [None, None]  # fmt: skip

    def claim() -> None:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer

    stopping = Clock()
    poll(claim, lambda job: None, stopping=stopping, once=False, every=5)
    assert stopping.waits == [10, 20, 40, 60, 60, 60, MAX_BACKOFF, 5, 5]
    # A revoked token; an answer this client cannot read (the claim may have been made); any
    # failure with once.
    for error, once in ((ServerError("revoked", status_code=401), False),
                        (ServerError("gave a bad answer"), False), (down, True)):  # fmt: skip

        def fails(error: ServerError = error) -> None:
            raise error

        with pytest.raises(ServerError):
            poll(fails, lambda job: None, stopping=threading.Event(), once=once, every=5)


def test_answers_lost_on_the_way_back_cost_the_daemon_no_attempt_and_no_second_record(
    server: LiveServer,
) -> None:
    """The server does what the daemon asks, and its answers are lost on the way back (a
    timeout, a proxy): the claim's, then the upload's; the completion does not get through at
    all. Before, the claim asked again leased nothing (the one job held for no one until its
    lease ran out, an attempt spent), an upload sent again was a second record, and a completion
    that did not get through was not asked again (the job redone once its lease ran out). Now
    the job is done at its first attempt with its one record, and the daemon saw no refusal."""
    import threading
    import time

    from tunecache.http import DeadlineTransport

    class LostOnTheWay(httpx.BaseTransport):
        """The real transport; each path's first call is lost: after the server did it (an
        answer lost) or before it got there (no connection)."""

        def __init__(self) -> None:
            self.inner = DeadlineTransport()
            self.lost: dict[str, str] = {"/v1/jobs/claim": "after", "/v1/records": "after",
                                         "/complete": "before"}  # fmt: skip

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            path = request.url.path
            when = next((self.lost.pop(p) for p in list(self.lost) if path.endswith(p)), None)
            if when == "before":
                raise httpx.ConnectError("connection refused", request=request)
            response = self.inner.handle_request(request)
            if when == "after":
                response.read()
                raise httpx.ReadTimeout("the answer was lost", request=request)
            return response

    key = key_for("matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32")
    with Client(server.url) as client:
        job = client.create_job(key).job
    transport = LostOnTheWay()
    options = DaemonOptions(backends=("tvm",), trials=2, workers=1, poll_seconds=0.1,
                            lease_seconds=120)  # fmt: skip
    with Client(server.url, transport=transport) as client:
        worker = Daemon(client, options)
        runner = threading.Thread(target=worker.run)
        runner.start()
        try:
            deadline = time.monotonic() + 120
            while (done := client_job(server, job.id)).state != "done":
                assert time.monotonic() < deadline and runner.is_alive(), done
                time.sleep(0.2)
        finally:
            worker.stop()
            runner.join(timeout=120)
    assert transport.lost == {}  # each was lost once
    with Client(server.url) as reader:
        records = reader.list_records().items
    assert done.attempts == 1 and [r.id for r in records] == [done.record_id] == worker.done
    assert worker.failed == []


def test_a_job_whose_completion_is_refused_is_given_back_not_tuned_again_for_good(
    server: LiveServer,
) -> None:
    """The server refuses a completion (here every one, 409): the daemon kept the job's lease,
    its next claim was that job again, and it tuned the job again and again (283 times in 8 s
    with a stub tune, in a review). Now it gives the job back, an attempt spent, and goes on."""
    from tunecache.http import DeadlineTransport

    class RefusesCompletions(httpx.BaseTransport):
        def __init__(self) -> None:
            self.inner = DeadlineTransport()

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.path.endswith("/complete"):
                body = b'{"status": 409, "detail": "refused", "errors": []}'
                return httpx.Response(409, content=body, headers={IDENTITY_HEADER: "tunecache/0"},
                                      request=request)  # fmt: skip
            return self.inner.handle_request(request)

    key = key_for("matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32")
    with Client(server.url) as client:
        jobs = [client.create_job(key, max_attempts=1).job]
    options = DaemonOptions(backends=("tvm",), trials=2, workers=1, once=True, lease_seconds=120)
    with Client(server.url, transport=RefusesCompletions()) as client:
        worker, looping = run_daemon(client, options, timeout=300)
    assert not looping, "the daemon kept tuning a job whose completion was refused"
    assert worker.failed == [job.id for job in jobs]
    with Client(server.url) as reader:
        states = {j.id: (j.state, j.attempts) for j in reader.list_jobs().items}
        assert len(reader.list_records().items) == 1  # tuned once
    assert states == {job.id: ("failed", 1) for job in jobs}


def test_daemons_sharing_a_host_name_and_pid_are_different_workers() -> None:
    """A worker that claims while it holds a lease is handed that job again: two daemons named
    alike (containers on one host network share its name, and often a pid) would be handed one
    job. Each daemon's name is its own."""
    with Client("http://127.0.0.1:9") as client:
        names = {Daemon(client, DaemonOptions(backends=("tvm",))).worker for _ in range(2)}
    assert len(names) == 2


def test_a_re_tune_leaves_out_the_config_a_verifier_rejected_at_its_key(server: LiveServer) -> None:
    """A verifier rejected the daemon's record and the key's job was queued again. The re-tune
    found the same config again and uploaded it: refused as the job's answer (before), or stored
    disputed, out of service until a verifier rejects it again and the job is queued again, round
    after round (since a finding holds for the config at its key). Now the daemon leaves out the
    configs rejected at its key, and the job is done with another, served."""
    from tests.factories import issue_token
    from tunecache.verification import VerificationCreate

    key = key_for("matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32")
    with Client(server.url) as client:
        job = client.create_job(key).job
    options = DaemonOptions(backends=("tvm",), trials=2, workers=1, once=True, lease_seconds=120)
    with Client(server.url) as client:
        first = Daemon(client, options)
        first.run()
        rejected = client.get_record(first.done[0])
    arch = local_device("cpu").fingerprint.arch
    with Client(server.url, token=issue_token(server.url, "verify")) as verifier:
        task = verifier.claim_verification("v", device_arch=arch, backends=["tvm"])
        assert task is not None and task.record.id == rejected.id
        failed = VerificationCreate(worker="v", outcome="failed", device_name="verifier",
                                    validation=rejected.validation.model_copy(
                                        update={"passed": False}))  # fmt: skip
        assert verifier.submit_verification(rejected.id, failed).status == "rejected"
    assert client_job(server, job.id).state == "queued"

    with Client(server.url) as client:
        second = Daemon(client, options)
        assert second.run() == 1 and second.failed == []
        retuned = client.get_record(second.done[0])
    assert retuned.config != rejected.config and retuned.status == "pending"
    assert client_job(server, job.id).record_id == retuned.id
    with Client(server.url) as client:
        assert client.lookup(key).config == retuned.config
    # searched again (or the default config, then never a candidate): left out, saying why
    again = [t for t in retuned.trials if t.config == rejected.config]
    assert all(t.status == "invalid" and "rejected this config" in t.error for t in again)


def test_a_daemon_leaves_out_the_configs_disputed_at_its_key(server: LiveServer) -> None:
    """A write token uploaded a key's best config and disputed its own record: a daemon's tune
    found that config, its upload was stored disputed, its completion refused (a disputed record
    answers no job), an attempt spent each time until the job failed. The daemon now leaves out
    the configs disputed at its key, as those a verifier rejected."""
    from tests.factories import AUTH, knobs, make_record
    from tests.test_trust import dispute_body, post_dispute

    key = key_for("matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32")
    best = make_record(key, time_ms=0.1, config=knobs(4))
    other = make_record(key, time_ms=0.2, config=knobs(8))
    with Client(server.url) as client:
        disputed = client.upload(best).record_id
        client.upload(other)
        job = client.create_job(key).job
        answer = post_dispute(server.url, disputed, AUTH, dispute_body(key))
        assert answer.json()["status"] == "disputed", answer.text
        refused = Daemon(client, DaemonOptions(backends=("tvm",))).rejected_at(job, key)
    assert refused == (dict(best.config),)


def test_after_a_failed_job_the_next_claim_waits_longer_each_time_up_to_the_poll() -> None:
    """A hostile server handed out a new job failing at once on every claim: 139 claims in 12 s.
    After work that failed, the claim waits 0.1 s, doubling with each failure in a row up to the
    poll interval; work done resets it."""
    import threading

    from tuner.polling import FAILED_WAIT, poll

    results = [False] * 5 + [True, False]

    class Clock(threading.Event):
        waits: list[float] = []

        def wait(self, timeout: float | None = None) -> bool:
            self.waits.append(float(timeout or 0))
            return self.is_set()

    stopping = Clock()

    def work(job: int) -> bool:
        if len(results) == 1:
            stopping.set()
        return results.pop(0)

    poll(lambda: 1, work, stopping=stopping, once=False, every=0.5)
    assert stopping.waits == [FAILED_WAIT, 2 * FAILED_WAIT, 4 * FAILED_WAIT, 0.5, 0.5,
                              FAILED_WAIT]  # fmt: skip


def test_a_job_spends_at_most_the_daemons_most_trials(server: LiveServer) -> None:
    """A write token queued a job of 1,000,000 trials: the daemon tuned it for hours, SIGTERM
    waiting on it. A job spends at most ``max_trials`` (and ``job_seconds``), whatever it asks."""
    key = key_for("matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32")
    with Client(server.url) as client:
        job = client.create_job(key, trials=1_000_000).job
    options = DaemonOptions(backends=("tvm",), trials=2, max_trials=3, job_seconds=600,
                            workers=1, once=True)  # fmt: skip
    with Client(server.url) as client:
        assert Daemon(client, options).run() == 1
        (record,) = client.list_records(kernel="matmul").items
        assert {j.id: j.state for j in client.list_jobs().items} == {job.id: "done"}
    # Three searched, and what choosing the winner measured besides (the default config).
    assert 1 <= record.search.trials <= 3 + 2


def test_a_job_that_fails_as_nothing_foresaw_is_given_back_and_the_daemon_goes_on(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A kernel's code failing as nothing caught (a user's ``tvm_compute`` returning no tensors:
    a TypeError from TVM) ended the daemon, and each daemon that claimed the job after its lease
    lapsed. Now that job is failed with its error, the workers are started afresh, and the next
    job is done. (The error is raised where tuning is called: the daemon's boundary.)"""
    import tuner.daemon as daemon_module

    real, tuned = daemon_module.tune, []

    def tune(key: Any, *args: Any, **kwargs: Any) -> Any:
        tuned.append(key)
        if len(tuned) == 1:
            raise RuntimeError("boom\nand more")
        return real(key, *args, **kwargs)

    monkeypatch.setattr(daemon_module, "tune", tune)
    keys = [key_for("matmul", "tvm", {"M": m, "N": 16, "K": 16}, "float32") for m in (16, 32)]
    with Client(server.url) as client:
        jobs = {client.create_job(k).job.id for k in keys}
    options = DaemonOptions(backends=("tvm",), trials=2, workers=1, once=True)
    with Client(server.url) as client, caplog.at_level(logging.WARNING, logger="tuner.daemon"):
        worker = Daemon(client, options)
        assert worker.run() >= 1 and len(worker.failed) == 1
    (failed,) = worker.failed
    assert failed in jobs and len(tuned) >= 2
    said = [r.getMessage() for r in caplog.records if r.name == "tuner.daemon"]
    assert f"job {failed}: failed: internal error: RuntimeError: boom" in said
    assert {client_job(server, j).state for j in jobs - {failed}} == {"done"}
    # given back, then retried: done by this daemon (an answered job's error is cleared), or
    # queued for the next, saying why it failed
    again = client_job(server, failed)
    assert again.state == "done" or again.error == "TuningError: internal error: RuntimeError: boom"


def test_a_daemon_whose_every_job_fails_as_nothing_foresaw_stops(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault of the daemon's own (a broken install) would fail every job it claims, each
    spending an attempt: after MAX_INTERNAL_ERRORS in a row it stops, raising."""
    import tuner.daemon as daemon_module
    from tuner.daemon import MAX_INTERNAL_ERRORS

    def tune(*args: Any, **kwargs: Any) -> Any:
        raise ImportError("a broken install")

    monkeypatch.setattr(daemon_module, "tune", tune)
    with Client(server.url) as client:
        for m in (16, 32, 64, 128):
            client.create_job(key_for("matmul", "tvm", {"M": m, "N": 16, "K": 16}, "float32"))
    options = DaemonOptions(backends=("tvm",), trials=2, workers=1, poll_seconds=0.1)
    with Client(server.url) as client:
        worker = Daemon(client, options)
        with pytest.raises(ImportError, match="a broken install"):
            worker.run()
    assert len(worker.failed) == MAX_INTERNAL_ERRORS


def test_a_daemon_reads_the_configs_refused_at_its_key_within_a_bound() -> None:
    """A server answering a job's listing of rejected and disputed records with thousands of
    trials each held a daemon at 3.8 GB (2 GiB read, the bound any listing has) before it tuned
    the job. Each status is read within 16 MiB: the configs, which is all it needs, fit."""
    import json
    from urllib.parse import parse_qs, urlsplit

    from tests.factories import knobs, make_record
    from tests.hostile import answer, serve
    from tunecache.jobs import JobPublic

    key = key_for("matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32")
    record = make_record(key, config=knobs(4)).model_dump(mode="json", by_alias=True)
    record["trials"] = record["trials"][:1] * 700  # about 7 MB a page of 100
    job = JobPublic.model_validate({
        "id": 1, "key_hash": key.digest(), "key": key.to_json(), "state": "running",
        "priority": 0, "source": "api", "attempts": 1, "max_attempts": 3, "error": "",
        "lease_owner": None, "lease_expires_at": None, "record_id": None,
        "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"})  # fmt: skip

    def fat(conn: Any, request: Any, seen: Any) -> None:
        asked = parse_qs(urlsplit(request.path).query)
        first, limit = int(asked.get("offset", ["0"])[0]), int(asked["limit"][0])
        items = [{**record, "id": first + i + 1, "key_hash": key.digest(),
                  "status": asked["status"][0], "created_at": "2026-01-01T00:00:00Z"}
                 for i in range(limit)]  # fmt: skip
        answer(conn, 200, json.dumps({"items": items, "count": 10**9}).encode())

    with serve(fat) as (url, seen), Client(url, token="t", timeout=30) as client:
        refused = Daemon(client, DaemonOptions(backends=("tvm",))).rejected_at(job, key)
    assert refused == (knobs(4),)
    listings = [r for r in seen.requests if r.startswith("GET /v1/records")]
    assert len(listings) <= 6, listings  # pages of ~7 MB, 3 a status at most: 20 before
