"""Shared fixtures: a real cache server (uvicorn in a subprocess, SQLite file on disk).

Every server started here knows one admin token (``tests.factories.TEST_TOKEN``, through
``TUNECACHE_SERVER_BOOTSTRAP_TOKEN``), and clients and CLI runs send it (``TUNECACHE_TOKEN``);
tests of auth itself pass other tokens, or none, explicitly. A request waits up to 30 s for a
slot instead of the default 0.02 s (``TUNECACHE_SERVER_MAX_WAIT``): bursts are what these tests
send; load shedding has tests of its own.

Without a GPU, Triton kernels run in Triton's CPU interpreter. Triton decides that when it is first
imported (Inductor imports it too), so the choice is made here, before any test module loads; the
measurement harness's worker processes inherit it.

Triton's compile cache is a new, empty folder for the whole run (``TRITON_CACHE_DIR``, inherited
by every process the tests start), removed afterwards: a warm ``~/.triton/cache`` hid a test that
failed with a cold one, and a test must pass on a fresh machine. So is the outbox of records
waiting for their upload (``TUNECACHE_OUTBOX``), and the tuner's working files
(``TUNECACHE_WORK_DIR``: MetaSchedule's databases, which a later tune of a workload starts from),
and the lock files through which timings take turns on a device (``TUNECACHE_LOCK_DIR``): never
the user's.
"""

from __future__ import annotations

import os
import tempfile

os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="tunecache-tests-triton-")
os.environ["TUNECACHE_OUTBOX"] = tempfile.mkdtemp(prefix="tunecache-tests-outbox-")
os.environ["TUNECACHE_WORK_DIR"] = tempfile.mkdtemp(prefix="tunecache-tests-work-")
os.environ["TUNECACHE_LOCK_DIR"] = tempfile.mkdtemp(prefix="tunecache-tests-locks-")
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
import subprocess
import sys

from tests.factories import TEST_TOKEN

os.environ["TUNECACHE_TOKEN"] = TEST_TOKEN
os.environ["TUNECACHE_SERVER_BOOTSTRAP_TOKEN"] = TEST_TOKEN
# Test servers queue a burst rather than shed it: the tests of storage and concurrency send
# bursts on purpose. The shedding tests start servers of their own (tests/test_admission.py).
os.environ.setdefault("TUNECACHE_SERVER_MAX_WAIT", "30")
# A failed job is claimable again at once here (tests of retries run to their limit); the delay
# has a test of its own (tests/test_jobs.py).
os.environ.setdefault("TUNECACHE_SERVER_RETRY_SECONDS", "0")
import atexit
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from cache_server.embedded import free_port

for _made in ("TRITON_CACHE_DIR", "TUNECACHE_OUTBOX", "TUNECACHE_WORK_DIR", "TUNECACHE_LOCK_DIR"):
    atexit.register(shutil.rmtree, os.environ[_made], ignore_errors=True)


@dataclass
class LiveServer:
    url: str
    db: str
    db_path: Path | None  # the SQLite file; None on PostgreSQL
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def start_server(
    db: str,
    db_path: Path | None,
    log: Path,
    port: int | None = None,
    env: dict[str, str] | None = None,
    args: Sequence[str] = (),
) -> LiveServer:
    """``tunecache serve`` in a subprocess, with more ``args``; ``env`` adds to this process's
    environment. Returns once it answers ``/health``."""
    port = port or free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    command = ["serve", "--db", db, "--port", str(port), *args]
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "tunecache_cli", *command],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}: {log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return LiveServer(url=url, db=db, db_path=db_path, process=process)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"server did not come up: {log.read_text()}")


def sqlite_server(tmp: Path) -> Iterator[LiveServer]:
    """A server over a new SQLite file in ``tmp``, stopped when the generator is closed."""
    db_path = tmp / "cache.db"
    live = start_server(f"sqlite:///{db_path}", db_path, tmp / "server.log")
    yield live
    live.stop()


@pytest.fixture(autouse=True)
def own_outbox(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own outbox: an upload one test could not send (to a port since closed)
    never meets another test's server that a reused port put at the same URL."""
    folder = tmp_path_factory.mktemp("outbox")
    monkeypatch.setenv("TUNECACHE_OUTBOX", str(folder))
    return folder


@pytest.fixture(autouse=True)
def lock_warning_unsaid(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test whose lock folder is unusable marks the warning said for the processes started
    from this one (tunecache.settings.LOCK_WARNED); the next test's is unsaid."""
    monkeypatch.delenv("TUNECACHE_LOCK_WARNED", raising=False)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    """A fresh uvicorn cache server on loopback over a new SQLite file."""
    yield from sqlite_server(tmp_path)


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One server for a whole module (for tests that only add distinct keys)."""
    yield from sqlite_server(tmp_path_factory.mktemp("shared-server"))


@pytest.fixture(scope="session")
def postgres_admin() -> Iterator[str]:
    """A throwaway PostgreSQL cluster for the session (required on CI, else skipped if absent)."""
    from tests.pg import postgres_cluster, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs PostgreSQL: {reason}")
        pytest.skip(reason)
    with postgres_cluster() as url:
        yield url


_databases = iter(range(1_000_000))


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path | None]:
    """A fresh, empty database URL of each kind (and the SQLite file, for SQLite)."""
    if request.param == "sqlite":
        path = tmp_path / "cache.db"
        return f"sqlite:///{path}", path
    from tests.pg import create_database

    admin = request.getfixturevalue("postgres_admin")
    return create_database(admin, f"test_{os.getpid()}_{next(_databases)}"), None


def database_server(
    database: tuple[str, Path | None], tmp: Path, env: dict[str, str] | None = None
) -> Iterator[LiveServer]:
    """A server over ``database`` (its log in ``tmp``), ``env`` added to its environment; stopped,
    if it still runs, when the generator is closed."""
    url, path = database
    live = start_server(url, path, tmp / "server.log", env=env)
    yield live
    if live.process.poll() is None:
        live.stop()


@pytest.fixture
def any_server(database: tuple[str, Path | None], tmp_path: Path) -> Iterator[LiveServer]:
    """A uvicorn cache server on loopback over each kind of database."""
    yield from database_server(database, tmp_path)


@pytest.fixture(scope="session")
def chromium() -> str:
    """Chromium's path (required on CI, where .ci/run installs it; else skipped if absent)."""
    from tests.dashboard_browser import find_chromium

    found = find_chromium()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI needs Chromium for the dashboard tests: apt-get install chromium")
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    return found


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where screenshots go: ``$TUNECACHE_ARTIFACTS``, else a temporary directory."""
    given = os.environ.get("TUNECACHE_ARTIFACTS")
    return Path(given) if given else tmp_path_factory.mktemp("dashboard-artifacts")


@pytest.fixture
def inductor_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Inductor's choice file in an empty Inductor cache folder (``tmp_path``), and what
    :func:`tunecache.inductor.enable` sets process-wide restored."""
    from torch._inductor import config
    from torch._inductor.codecache import CacheBase
    from torch._inductor.remote_cache import RemoteAutotuneCache

    import tunecache.inductor
    from tunecache.inductor.choices import local_cache_path

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    CacheBase.get_local_cache_path.cache_clear()  # Inductor keeps the first folder it saw
    monkeypatch.setattr(RemoteAutotuneCache, "backend_override_cls", None)
    monkeypatch.setattr(tunecache.inductor, "_active", None)
    try:
        with config.patch(autotune_remote_cache=config.autotune_remote_cache):
            yield local_cache_path()
    finally:
        CacheBase.get_local_cache_path.cache_clear()
