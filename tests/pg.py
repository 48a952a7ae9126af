"""A throwaway PostgreSQL cluster for tests: initdb in a temp dir, a free loopback port, trust auth.

Uses the server binaries from Debian's ``postgresql`` package (``.ci/run`` installs it). Run as
root, the cluster runs as the ``postgres`` user (``initdb`` refuses root).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cache_server.embedded import free_port

USER = "tunecache"


def pg_binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def unavailable_reason() -> str | None:
    if pg_binary("initdb") is None or pg_binary("pg_ctl") is None:
        return "PostgreSQL server binaries not found (apt-get install postgresql)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser"
    return None


@contextmanager
def postgres_cluster() -> Iterator[str]:
    """Starts a cluster; yields its admin URL (``postgresql+psycopg://tunecache@127.0.0.1:P/``)."""
    root = Path(tempfile.mkdtemp(prefix="tunecache-pg-"))
    data, log = root / "data", root / "server.log"
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    initdb, pg_ctl = pg_binary("initdb"), pg_binary("pg_ctl")
    assert initdb and pg_ctl
    subprocess.run([*as_user, initdb, "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8"],
                   check=True, capture_output=True)  # fmt: skip
    options = (
        f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    )
    subprocess.run([*as_user, pg_ctl, "-D", str(data), "-o", options, "-l", str(log), "-w", "start"],
                   check=True, capture_output=True)  # fmt: skip
    try:
        yield f"postgresql+psycopg://{USER}@127.0.0.1:{port}"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True, check=False)  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


def create_database(admin_url: str, name: str) -> str:
    """Creates database ``name``; returns its URL."""
    import psycopg

    dsn = admin_url.replace("postgresql+psycopg://", "postgresql://") + "/postgres"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{admin_url}/{name}"
