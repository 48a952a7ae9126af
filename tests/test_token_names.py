"""A token's name is who records and the dashboard say uploaded or verified something: a new one
is plain ASCII words, and no two live tokens share one, case and blanks aside. Names stored or
exported before that rule stay readable, and their tokens keep working."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from cache_server import tokens
from cache_server.db import make_sessionmaker
from cache_server.migrate import prepare
from tests.conftest import LiveServer
from tests.factories import AUTH
from tunecache.snapshot_provenance import RecordProvenance
from tunecache.tokens import TokenCreate

LOOKALIKES = [" ", "ops ", " ops", "o  ps", "\u043eps", "\u2170", "ops\u200b", "ops\n", "ops,ci"]


@pytest.mark.parametrize("name", LOOKALIKES)
def test_a_new_name_that_could_pass_for_another_is_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="token's name is ASCII"):
        TokenCreate(name=name, scope="read")


@pytest.mark.parametrize("name", ["ops", "gpu-node-3", "ci@host:/a.b_c", "night shift 2"])
def test_plain_names_are_taken(name: str) -> None:
    assert TokenCreate(name=name, scope="read").name == name


def _create(url: str, name: str, scope: str = "read") -> httpx.Response:
    return httpx.post(f"{url}/v1/tokens", json={"name": name, "scope": scope}, headers=AUTH,
                      timeout=30)  # fmt: skip


def test_a_live_name_is_not_given_twice_case_aside(any_server: LiveServer) -> None:
    url = any_server.url
    assert _create(url, "\u043eps").status_code == 422  # a Cyrillic о
    first = _create(url, "ops", "read")
    assert first.status_code == 201, first.text
    for again, scope in (("ops", "admin"), ("OPS", "write"), ("Ops", "read")):
        refused = _create(url, again, scope)
        assert refused.status_code == 409, refused.text
        assert "'ops'" in refused.json()["detail"]  # names the clash
    listed = httpx.get(f"{url}/v1/tokens", headers=AUTH).json()["items"]
    assert [t["name"].lower() for t in listed].count("ops") == 1
    gone = httpx.delete(f"{url}/v1/tokens/{first.json()['info']['id']}", headers=AUTH)
    assert gone.status_code == 200
    assert _create(url, "ops", "write").status_code == 201  # a revoked token's name is free


def test_the_cli_on_the_database_refuses_a_live_name(database: tuple[str, Path | None]) -> None:
    url, _ = database

    def create(name: str) -> subprocess.CompletedProcess[str]:
        argv = ["token", "create", "--db", url, "--name", name, "--scope", "admin"]
        return subprocess.run([sys.executable, "-m", "tunecache_cli", *argv], text=True,
                              capture_output=True, timeout=120, env=dict(os.environ))  # fmt: skip

    assert create("ops").returncode == 0
    clash = create("OPS")
    assert clash.returncode == 2, clash.stderr
    assert "--name" in clash.stderr and "'ops'" in clash.stderr
    assert "Traceback" not in clash.stderr
    odd = create("ops ")
    assert odd.returncode == 2 and "--name" in odd.stderr


def test_the_cli_through_a_server_refuses_a_live_name_as_bad_input(
    any_server: LiveServer,
) -> None:
    """The same clash through a server is bad input too: exit 2 naming ``--name``, as with
    ``--db`` (the server's 409 was exit 1)."""
    env = {**os.environ, "TUNECACHE_URL": any_server.url, "TUNECACHE_TOKEN": AUTH[
        "Authorization"].removeprefix("Bearer ")}  # fmt: skip
    argv = [sys.executable, "-m", "tunecache_cli", "token", "create", "--name"]
    first = subprocess.run([*argv, "cli-ops", "--scope", "read"], text=True,
                           capture_output=True, timeout=120, env=env)  # fmt: skip
    assert first.returncode == 0, first.stderr
    clash = subprocess.run([*argv, "CLI-ops", "--scope", "read"], text=True,
                           capture_output=True, timeout=120, env=env)  # fmt: skip
    assert clash.returncode == 2, clash.stderr
    assert "--name" in clash.stderr and "'cli-ops'" in clash.stderr, clash.stderr
    assert "Traceback" not in clash.stderr


def test_older_names_keep_working_and_still_clash(database: tuple[str, Path | None]) -> None:
    """A token named before the rule (stored as it was) still authenticates, and a new name that
    would pass for it is refused."""
    engine = prepare(database[0])
    try:
        with make_sessionmaker(engine).begin() as session:
            old, _ = tokens.issue(session, name="ops ", scope="write")
            tokens.issue(session, name="\u2170", scope="read")  # ⅰ
        with make_sessionmaker(engine).begin() as session:
            row = tokens.authenticate(session, token=old)
            assert row is not None and row.name == "ops "
            for clash in ("ops", "OPS", "i"):
                with pytest.raises(tokens.NameTaken):
                    tokens.create(session, name=clash, scope="read")
    finally:
        engine.dispose()


def test_snapshots_from_older_servers_with_such_names_still_read() -> None:
    now = datetime.now(UTC).isoformat()
    stated = RecordProvenance.model_validate({
        "status": "verified", "uploaded_by": "\u043eps ", "created_at": now,
        "verification": {"verifier": "\u2170 (trusted uploader)", "device_name": "cpu",
                         "verified_at": now, "retimed": False},
        "uploaders": ["timing"],
    })  # fmt: skip
    assert stated.uploaded_by == "\u043eps "


def test_concurrent_creates_of_one_name_store_one(database: tuple[str, Path | None]) -> None:
    """Two creates of one name at once: the second waits for the first (its name lock on
    PostgreSQL, its write lock on SQLite), then finds the name taken."""
    engine = prepare(database[0])
    sessions = make_sessionmaker(engine)
    outcome: list[BaseException | None] = []

    def second() -> None:
        try:
            with sessions.begin() as session:
                tokens.create(session, name="ops", scope="write")
            outcome.append(None)
        except Exception as exc:  # what it raised is the test's to judge
            outcome.append(exc)

    try:
        with sessions.begin() as session:
            tokens.create(session, name="ops", scope="read")
            racer = threading.Thread(target=second)
            racer.start()
            racer.join(timeout=1.0)
            assert racer.is_alive()  # held until the first commits
        racer.join(timeout=60)
        assert len(outcome) == 1 and isinstance(outcome[0], tokens.NameTaken), outcome
        with sessions() as session:
            live = [r.name for r in tokens.list_tokens(session) if r.name == "ops"]
        assert live == ["ops"]
    finally:
        engine.dispose()
