"""Revoking a token that leaked takes the records served on its word alone out of service.

Before, a revoked token's uploads stayed served: pending ones under the default policy, a trusted
token's (verified at once) under both, and an admin had to dispute them one by one. A revocation
counts them; ``withdraw`` disputes them until a verifier checks each. Through a real server on
loopback over SQLite and PostgreSQL, the CLI, and the migration that fills in stored records.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, start_server
from tests.factories import AUTH, CPU, knobs, make_key, make_record
from tests.test_auth import tunecache
from tests.test_trust import _passed, dispute_body, post_dispute, token
from tunecache import Client, Key
from tunecache.verification import trust_text

DEFAULT = knobs(99)


def _token_id(url: str, name: str) -> int:
    listed = httpx.get(f"{url}/v1/tokens", headers=AUTH).json()["items"]
    return int(next(t["id"] for t in listed if t["name"] == name))


def _served(url: str, key: Key) -> object:
    """The config a consumer is served at ``key`` (``DEFAULT`` on a miss)."""
    with Client(url) as client:
        return client.lookup(key, default=DEFAULT).config


def _status(url: str, record_id: int) -> str:
    with Client(url) as client:
        return client.get_record(record_id).status


def migrated_sessions(url: str) -> Any:
    """Sessions of the database at ``url``, migrated to the head, its first token an admin's."""
    from cache_server import tokens
    from cache_server.db import make_engine, make_sessionmaker
    from cache_server.migrate import upgrade

    upgrade(url)
    sessions = make_sessionmaker(make_engine(url))
    with sessions() as session:
        tokens.issue(session, name="admin", scope="admin")
        session.commit()
    return sessions


def authenticated_then_withdrawn(
    sessions: Any, request: Any, *, secret: str, token_id: int
) -> tuple[Any, Any]:
    """``request`` authenticates ``secret`` (committed), then another session revokes that token
    withdrawing its records (committed): a write authenticated before a withdrawal, which
    ``request`` goes on to store after it. Returns the authenticated token and the revoked one."""
    from cache_server import tokens

    authenticated = tokens.authenticate(request, token=secret)
    assert authenticated is not None
    request.commit()
    with sessions() as admin:
        revoked = tokens.revoke(admin, token_id=token_id, withdraw=True)
        admin.commit()
    assert revoked is not None
    return authenticated, revoked


def test_a_revocation_counts_the_leaked_tokens_records_and_withdraw_disputes_them(
    any_server: LiveServer,
) -> None:
    url = any_server.url
    shared, alone, checked = make_key(m=64), make_key(m=2048), make_key(m=4096)
    leaked, honest = token(url, "leaked", "write"), token(url, "honest", "write")
    verifier = token(url, "gpu-verifier", "verify")
    with Client(url, token=leaked) as client:
        passed = client.upload(make_record(checked, time_ms=1.0, config=knobs(4))).record_id
    with Client(url, token=verifier) as client:
        task = client.claim_verification("v", device_arch=CPU.arch, backends=["tvm"])
        assert task is not None and task.record.id == passed
        assert client.submit_verification(passed, _passed("v", 1.0)).status == "verified"
    with Client(url, token=honest) as client:
        client.upload(make_record(shared, time_ms=2.0, config=knobs(2)))
    with Client(url, token=leaked) as client:
        fast = client.upload(make_record(shared, time_ms=0.5, config=knobs(1))).record_id
        only = client.upload(make_record(alone, time_ms=1.0, config=knobs(3))).record_id
    assert _served(url, shared) == knobs(1)
    leaked_id = _token_id(url, "leaked")

    plain = httpx.delete(f"{url}/v1/tokens/{leaked_id}", headers=AUTH)
    assert plain.status_code == 200, plain.text
    assert (plain.json()["withdrawn"], plain.json()["standing"]) == (0, 2)
    assert _served(url, shared) == knobs(1)  # a routine revocation leaves its work served

    later = httpx.delete(f"{url}/v1/tokens/{leaked_id}", params={"withdraw": "true"}, headers=AUTH)
    assert later.status_code == 200, later.text
    assert later.json()["revoked_at"] == plain.json()["revoked_at"]  # revoked once
    assert (later.json()["withdrawn"], later.json()["standing"]) == (2, 0)
    assert _served(url, shared) == knobs(2)  # the honest record, though slower
    assert _served(url, alone) == DEFAULT
    assert _served(url, checked) == knobs(4)  # a verifier passed it: not on the token's word
    assert [_status(url, i) for i in (fast, only, passed)] == ["disputed", "disputed", "verified"]

    with Client(url, token=verifier) as client:  # a verifier restores what holds up
        for round_ in range(3):  # the honest pending record too, whichever comes first
            task = client.claim_verification(f"v{round_}", device_arch=CPU.arch,
                                             backends=["tvm"])  # fmt: skip
            assert task is not None
            finding = _passed(f"v{round_}", task.record.timing.median_ms)
            assert client.submit_verification(task.record.id, finding).status == "verified"
    assert [_status(url, i) for i in (fast, only)] == ["verified", "verified"]
    assert _served(url, shared) == knobs(1)
    again = httpx.delete(f"{url}/v1/tokens/{leaked_id}?withdraw=true", headers=AUTH).json()
    assert (again["withdrawn"], again["standing"]) == (0, 0)


def test_a_trusted_tokens_records_leave_the_verified_policy_too(tmp_path: Path) -> None:
    db_path = tmp_path / "cache.db"
    live = start_server(f"sqlite:///{db_path}", db_path, tmp_path / "server.log",
                        args=["--policy", "verified"])  # fmt: skip
    try:
        url, key = live.url, make_key(m=64)
        with Client(url, token=token(url, "ci", "write", trusted=True)) as client:
            record_id = client.upload(make_record(key, config=knobs(5))).record_id
        assert _status(url, record_id) == "verified" and _served(url, key) == knobs(5)
        answer = httpx.delete(
            f"{url}/v1/tokens/{_token_id(url, 'ci')}?withdraw=1", headers=AUTH
        ).json()  # fmt: skip
        assert answer["withdrawn"] == 1 and _status(url, record_id) == "disputed"
        assert _served(url, key) == DEFAULT
    finally:
        live.stop()


def test_withdraw_that_is_not_a_yes_or_no_is_a_422(server: LiveServer) -> None:
    url = server.url
    token(url, "laptop", "write")
    laptop = _token_id(url, "laptop")
    refused = httpx.delete(f"{url}/v1/tokens/{laptop}?withdraw=maybe", headers=AUTH)
    assert refused.status_code == 422 and "withdraw" in refused.text
    listed = httpx.get(f"{url}/v1/tokens", headers=AUTH).json()["items"]
    assert any(t["name"] == "laptop" for t in listed)  # not revoked by the refused call


def test_the_cli_says_what_stays_served_and_withdraws_on_request(server: LiveServer) -> None:
    url = server.url
    asked = httpx.post(f"{url}/v1/misses", json={"key": make_key(m=64).to_json()}, headers=AUTH)
    assert asked.status_code == 202, asked.text
    with Client(url, token=token(url, "laptop", "write")) as client:  # answers the miss
        record_id = client.upload(make_record(make_key(m=64), config=knobs(1))).record_id
    laptop = str(_token_id(url, "laptop"))
    as_admin = {"TUNECACHE_TOKEN": AUTH["Authorization"].removeprefix("Bearer ")}
    plain = tunecache("token", "revoke", laptop, "--server", url, env=as_admin)
    assert plain.returncode == 0, plain.stderr
    assert "1 record that no verifier passed still served" in plain.stderr
    assert "revoking it again with --withdraw" in plain.stderr
    assert _status(url, record_id) == "pending"
    direct = tunecache("token", "revoke", laptop, "--withdraw", "--db", server.db)
    assert direct.returncode == 0, direct.stderr
    assert "withdrew 1 record served on its word alone" in direct.stderr
    assert "still served" not in direct.stderr and "Traceback" not in direct.stderr
    assert _status(url, record_id) == "disputed"
    job = httpx.get(f"{url}/v1/jobs", headers=AUTH).json()["items"][0]
    assert (job["state"], job["error"]) == ("queued", "the records of token laptop were "
                                            "withdrawn: its key is served by none")  # fmt: skip
    with Client(url) as client:  # as `tunecache get` and `records show` explain it
        explained = trust_text(client.get_record(record_id))
    assert "disputed 0x" not in explained and "token was revoked" in explained, explained


def migrated_again(url: str, revision: str, ids: dict[str, int], column: str) -> dict[str, Any]:
    """``column`` of each record of ``ids`` once the database at ``url`` went back to
    ``revision`` and up to the head again (the schema checked)."""
    from alembic import command

    from cache_server.db import make_engine, make_sessionmaker
    from cache_server.migrate import alembic_config, check_schema, upgrade
    from cache_server.models import RecordRow

    command.downgrade(alembic_config(url), revision)
    upgrade(url)
    check_schema(make_engine(url))
    with make_sessionmaker(make_engine(url))() as session:
        return {what: getattr(session.get(RecordRow, i), column) for what, i in ids.items()}


def test_the_migration_gives_stored_records_the_token_whose_word_serves_them(
    database: tuple[str, Path | None],
) -> None:
    """0019: a stored record standing on its uploader's word (pending, or a trusted token's
    upload) gets the token of its uploader's name where one token alone has that name; a record a
    verifier passed, and one whose uploader's name two tokens had, get none."""
    from alembic import command
    from sqlalchemy import text

    from cache_server import tokens
    from cache_server.db import make_engine, make_sessionmaker
    from cache_server.migrate import alembic_config, upgrade
    from cache_server.models import RecordRow
    from cache_server.queries import add_record
    from tunecache.schemas import VerificationPublic

    url, _ = database
    upgrade(url)
    with make_sessionmaker(make_engine(url))() as session:
        _, alice = tokens.issue(session, name="alice", scope="write")
        _, ci = tokens.issue(session, name="ci", scope="write", trusted=True)
        _, twice = tokens.issue(session, name="twice", scope="write")
        _, again = tokens.issue(session, name="twice", scope="write")
        session.flush()
        uploads = {
            "pending": (alice, 1), "trusted": (ci, 2), "checked": (alice, 3), "shared": (twice, 4),
            "disputed": (alice, 5),
        }  # fmt: skip
        ids = {}
        for what, (uploader, m) in uploads.items():
            key = make_key(m=64 * m)
            added = add_record(session, key_hash=key.digest(), record=make_record(key),
                               uploader=uploader)  # fmt: skip
            ids[what] = added.record_id
        checked = session.get(RecordRow, ids["checked"])
        assert checked is not None  # as a verifier's pass leaves it
        checked.status = "verified"
        checked.verification = VerificationPublic(
            passed=True, verifier="gpu-verifier", device_name="v", verified_at=datetime.now(UTC)
        ).model_dump(mode="json")  # fmt: skip
        disputed = session.get(RecordRow, ids["disputed"])
        assert disputed is not None
        disputed.status = "disputed"  # a twin's dispute, before any verifier's pass
        session.commit()
        expected = {"pending": alice.id, "trusted": ci.id, "checked": None, "shared": None,
                    "disputed": alice.id}  # fmt: skip
        assert again.id != twice.id
    assert migrated_again(url, "0018", ids, "vouched_by") == expected
    command.downgrade(alembic_config(url), "0018")  # and back: every record kept
    with make_engine(url).connect() as connection:
        assert connection.execute(text("select count(*) from records")).scalar_one() == 5


def test_a_verifiers_pass_of_an_honest_copy_does_not_serve_a_withdrawn_one_again(
    server: LiveServer,
) -> None:
    """A withdrawn record of a config a teammate uploaded too (its twin) stays out when a
    verifier passes the teammate's: its time is the leaked token's claim, which the verifier did
    not check. Before, the pass gave every disputed twin its standing back, and the made-up time
    ranked the config first again."""
    url = server.url
    key = make_key(m=64)
    leaked, honest, other = (token(url, name, "write") for name in ("leaked", "honest", "other"))
    with Client(url, token=honest) as client:
        copy = client.upload(make_record(key, time_ms=2.0, config=knobs(1))).record_id
    with Client(url, token=other) as client:
        client.upload(make_record(key, time_ms=1.0, config=knobs(2)))
    with Client(url, token=leaked) as client:
        made_up = client.upload(make_record(key, time_ms=0.01, config=knobs(1))).record_id
    httpx.delete(f"{url}/v1/tokens/{_token_id(url, 'leaked')}?withdraw=true", headers=AUTH)
    assert _served(url, key) == knobs(2)
    consumer = {"Authorization": f"Bearer {token(url, 'consumer', 'read')}"}
    disputed = post_dispute(url, copy, consumer, dispute_body(key))
    assert disputed.status_code == 200, disputed.text
    with Client(url, token=token(url, "gpu-verifier", "verify")) as client:
        task = client.claim_verification("v", device_arch=CPU.arch, backends=["tvm"])
        assert task is not None and task.record.id == copy
        assert client.submit_verification(copy, _passed("v", 2.0)).status == "verified"
    assert _status(url, made_up) == "disputed"
    assert _served(url, key) == knobs(2)  # 1.0 ms beats the copy's 2.0 ms, re-timed


def test_a_verify_token_is_never_handed_its_own_upload(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A verify token may upload (its scope grants writes): it claimed its own made-up record
    and passed it, which then stood as a verifier's finding and left the token's word behind it
    (withdrawing the token withdrew nothing). Another verify token checks it; the token's own
    claims are told why they find nothing (one token for a daemon and its verifier left the
    daemon's uploads unverified without a word)."""
    url = server.url
    key = make_key(m=64)
    mallory = token(url, "mallory", "verify")
    with Client(url, token=mallory) as client:
        record_id = client.upload(make_record(key, time_ms=0.001, config=knobs(1))).record_id
        claim = {"device_arch": CPU.arch, "backends": ["tvm"], "lease_seconds": 60.0}
        with caplog.at_level(logging.WARNING, logger="tunecache.worker_calls"):
            assert client.claim_verification("m", **claim) is None
            assert client.claim_verification("m", **claim) is None  # said once, not each poll
        said = [
            r.getMessage() for r in caplog.records if "await another verifier" in r.getMessage()
        ]
        assert len(said) == 1 and said[0].startswith(f"1 record of {CPU.arch} await"), said
        assert "give the tuning daemon a write token of its own" in said[0]
    with Client(url, token=token(url, "gpu-verifier", "verify")) as client:
        task = client.claim_verification("v", **claim)
        assert task is not None and task.record.id == record_id
    answer = httpx.delete(f"{url}/v1/tokens/{_token_id(url, 'mallory')}", headers=AUTH).json()
    assert answer["standing"] == 1


def test_an_import_under_a_token_revoked_after_it_authenticated_stores_nothing(
    database: tuple[str, Path | None],
) -> None:
    """The request authenticated its token, then a revocation with ``withdraw`` committed, then
    the request stored: its records were stored on the revoked token's word, after the
    withdrawal had counted, and served. A write now reads its token live before any key's lock
    (under a share lock on PostgreSQL), as uploads do."""
    from cache_server import snapshots, tokens, withdrawal
    from cache_server.queries import add_record

    url, _ = database
    sessions = migrated_sessions(url)
    with sessions() as session:
        secret, row = tokens.issue(session, name="leaked", scope="write")
        session.commit()
        leaked_id = row.id
    with sessions() as request:
        authenticated, revoked = authenticated_then_withdrawn(
            sessions, request, secret=secret, token_id=leaked_id
        )
        assert revoked.withdrawn == 0
        with pytest.raises(tokens.Revoked, match="nothing was stored"):
            snapshots.import_records(request, records=[make_record(make_key(m=64))],
                                     uploader=authenticated)  # fmt: skip
        request.rollback()
        key = make_key(m=128)  # an upload reads its token behind its key's lock
        with pytest.raises(tokens.Revoked, match="nothing was stored"):
            add_record(request, key_hash=key.digest(), record=make_record(key),
                       uploader=authenticated)  # fmt: skip
        request.rollback()
    with sessions() as session:
        assert withdrawal.standing(session, token_id=leaked_id) == 0


def test_revoke_withdraw_against_a_server_that_knows_no_withdrawal_fails_saying_so(
    tmp_path: Path,
) -> None:
    """An older server ignores ``withdraw=true``: the CLI said "withdrew 0 records" and exited
    0, the records still served. A fake server at the CLI's transport answers as such a server
    did (no counts)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    old = {"id": 3, "name": "laptop", "scope": "write", "prefix": "tc_abcde",
           "created_at": "2026-01-01T00:00:00Z", "revoked_at": "2026-01-02T00:00:00Z"}  # fmt: skip

    class OldServer(BaseHTTPRequestHandler):
        def do_DELETE(self) -> None:
            body = json.dumps(old).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), OldServer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        as_admin = {"TUNECACHE_TOKEN": AUTH["Authorization"].removeprefix("Bearer ")}
        asked = tunecache("token", "revoke", "3", "--withdraw", "--server", url, env=as_admin)
        assert asked.returncode == 1, asked.stderr
        assert "withdrew none of its records: the server does not know --withdraw" in asked.stderr
        plain = tunecache("token", "revoke", "3", "--server", url, env=as_admin)
        assert plain.returncode == 0 and "still served" not in plain.stderr, plain.stderr
    finally:
        httpd.shutdown()
