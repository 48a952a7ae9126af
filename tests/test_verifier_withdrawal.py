"""Revoking a verify token that leaked withdraws its findings: what it passed and what it rejected.

Before, a pass was not tied to the token that made it: a leaked verify token's pass of an
accomplice's made-up record stood as a verifier's finding after its revocation (verified, served
under both policies, its made-up time ranking it first), and an honest record it rejected stayed
out of service. Through a real server on loopback over SQLite and PostgreSQL, and the migration
that fills in stored records.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer
from tests.factories import AUTH, CPU, knobs, make_key, make_record
from tests.test_auth import tunecache
from tests.test_token_withdrawal import (
    DEFAULT,
    _served,
    _status,
    _token_id,
    authenticated_then_withdrawn,
    migrated_again,
    migrated_sessions,
)
from tests.test_trust import _passed, dispute_body, post_dispute, token
from tunecache import Client
from tunecache.verification import VerificationCreate

CLAIM = {"device_arch": CPU.arch, "backends": ["tvm"], "lease_seconds": 60.0}


def _failed(worker: str) -> VerificationCreate:
    return VerificationCreate(worker=worker, outcome="failed", device_name="v",
                              error="wrong result at the golden check")  # fmt: skip


def _decide(client: Client, worker: str, findings: dict[int, bool]) -> None:
    """Claims every record the token is handed, passing or failing each as ``findings`` say."""
    while (task := client.claim_verification(worker, **CLAIM)) is not None:
        record = task.record
        passed = findings[record.id]
        finding = _passed(worker, record.timing.median_ms) if passed else _failed(worker)
        expected = "verified" if passed else "rejected"
        assert client.submit_verification(record.id, finding).status == expected


def test_withdrawing_a_leaked_verify_token_questions_what_it_passed_and_rejected(
    any_server: LiveServer,
) -> None:
    url = any_server.url
    faked, honest_key = make_key(m=64), make_key(m=2048)
    with Client(url, token=token(url, "accomplice", "write")) as client:
        made_up = client.upload(make_record(faked, time_ms=0.01, config=knobs(1))).record_id
    with Client(url, token=token(url, "teammate", "write")) as client:
        slower = client.upload(make_record(faked, time_ms=1.0, config=knobs(2))).record_id
        honest = client.upload(make_record(honest_key, time_ms=1.0, config=knobs(3))).record_id
    with Client(url, token=token(url, "leaked-verifier", "verify")) as client:
        _decide(client, "m", {made_up: True, slower: False, honest: False})
    assert _served(url, faked) == knobs(1) and _served(url, honest_key) == DEFAULT
    leaked = _token_id(url, "leaked-verifier")

    plain = httpx.delete(f"{url}/v1/tokens/{leaked}", headers=AUTH).json()
    assert (plain["withdrawn"], plain["standing"]) == (0, 3)
    withdrawn = httpx.delete(f"{url}/v1/tokens/{leaked}?withdraw=true", headers=AUTH).json()
    assert (withdrawn["withdrawn"], withdrawn["standing"]) == (3, 0)
    assert [_status(url, i) for i in (made_up, slower, honest)] == ["disputed"] * 3
    assert _served(url, faked) == DEFAULT and _served(url, honest_key) == DEFAULT

    with Client(url, token=token(url, "gpu-verifier", "verify")) as client:
        _decide(client, "v", {made_up: False, slower: True, honest: True})
    assert [_status(url, i) for i in (made_up, slower, honest)] == [
        "rejected", "verified", "verified"]  # fmt: skip
    assert _served(url, faked) == knobs(2) and _served(url, honest_key) == knobs(3)
    again = httpx.delete(f"{url}/v1/tokens/{leaked}?withdraw=true", headers=AUTH).json()
    assert (again["withdrawn"], again["standing"]) == (0, 0)  # another verifier decided them


def test_an_honest_copys_pass_does_not_serve_again_what_a_leaked_verifier_timed(
    server: LiveServer,
) -> None:
    """A record a leaked verifier passed with a made-up time, withdrawn, stays out when another
    verifier passes an honest copy of its config: its time is the leaked token's, which that
    verifier did not check (it was restored, verified, and ranked its config first again)."""
    url = server.url
    key = make_key(m=64)
    with Client(url, token=token(url, "accomplice", "write")) as client:
        made_up = client.upload(make_record(key, time_ms=0.01, config=knobs(1))).record_id
    with Client(url, token=token(url, "leaked-verifier", "verify")) as client:
        _decide(client, "m", {made_up: True})
    with Client(url, token=token(url, "teammate", "write")) as client:
        copy = client.upload(make_record(key, time_ms=2.0, config=knobs(1))).record_id
        client.upload(make_record(key, time_ms=1.0, config=knobs(2)))
    httpx.delete(f"{url}/v1/tokens/{_token_id(url, 'leaked-verifier')}?withdraw=1", headers=AUTH)
    consumer = {"Authorization": f"Bearer {token(url, 'consumer', 'read')}"}
    assert post_dispute(url, copy, consumer, dispute_body(key)).status_code == 200
    with Client(url, token=token(url, "gpu-verifier", "verify")) as client:
        while (task := client.claim_verification("v", **CLAIM)) is not None:
            if task.record.id == copy:
                assert client.submit_verification(copy, _passed("v", 2.0)).status == "verified"
                break
            assert task.record.id == made_up  # not this verifier's machine: back to the queue
            unverifiable = VerificationCreate(worker="v", outcome="unverifiable", device_name="v")
            assert client.submit_verification(made_up, unverifiable).status == "disputed"
    assert _status(url, made_up) == "disputed"
    assert _served(url, key) == knobs(2)  # 1.0 ms beats the copy's 2.0 ms, re-timed


def test_the_migration_gives_decided_records_the_verify_token_of_their_verifier(
    database: tuple[str, Path | None],
) -> None:
    """0020: a record a verifier's finding decided gets the verify (or admin) token of the
    verifier's name where one such token alone has it; a trusted uploader's verification, a
    write token's name, a name two tokens share, and a pending record get none."""

    from cache_server import tokens
    from cache_server.db import make_engine, make_sessionmaker
    from cache_server.migrate import upgrade
    from cache_server.models import RecordRow
    from cache_server.queries import add_record
    from tunecache.schemas import VerificationPublic

    url, _ = database
    upgrade(url)
    with make_sessionmaker(make_engine(url))() as session:
        _, alice = tokens.issue(session, name="alice", scope="write")
        _, gpu = tokens.issue(session, name="gpu", scope="verify")
        _, ops = tokens.issue(session, name="ops", scope="admin")
        for name in ("twice", "twice"):
            tokens.issue(session, name=name, scope="verify")
        session.flush()
        findings = {  # what: (status, verifier named, passed)
            "passed": ("verified", "gpu", True), "rejected": ("rejected", "gpu", False),
            "by admin": ("verified", "ops", True), "disputed since": ("disputed", "gpu", True),
            "trusted": ("verified", "alice (trusted uploader)", True),
            "write name": ("verified", "alice", True), "shared": ("verified", "twice", True),
            "pending": ("pending", None, None),
        }  # fmt: skip
        ids = {}
        for m, (what, (status, verifier, passed)) in enumerate(findings.items(), start=1):
            key = make_key(m=64 * m)
            added = add_record(session, key_hash=key.digest(), record=make_record(key),
                               uploader=alice)  # fmt: skip
            row = session.get(RecordRow, added.record_id)
            assert row is not None
            row.status, ids[what] = status, row.id
            if verifier is not None:
                row.verification = VerificationPublic(
                    passed=bool(passed), verifier=verifier, device_name="v",
                    verified_at=datetime.now(UTC),
                ).model_dump(mode="json")  # fmt: skip
        session.commit()
        expected = {what: None for what in findings} | {
            "passed": gpu.id,
            "rejected": gpu.id,
            "by admin": ops.id,
            "disputed since": gpu.id,
        }
    assert migrated_again(url, "0019", ids, "checked_by") == expected


def test_the_cli_counts_a_verify_tokens_findings_as_standing_on_its_word(
    server: LiveServer,
) -> None:
    url = server.url
    key = make_key(m=64)
    with Client(url, token=token(url, "teammate", "write")) as client:
        record_id = client.upload(make_record(key, config=knobs(1))).record_id
    with Client(url, token=token(url, "leaked-verifier", "verify")) as client:
        _decide(client, "m", {record_id: True})
    leaked = str(_token_id(url, "leaked-verifier"))
    as_admin = {"TUNECACHE_TOKEN": AUTH["Authorization"].removeprefix("Bearer ")}
    plain = tunecache("token", "revoke", leaked, "--server", url, env=as_admin)
    assert plain.returncode == 0, plain.stderr
    said = (
        "1 record still standing on its word (its uploads no verifier passed, its passes "
        "and rejections as a verifier): if it leaked, revoking it again with --withdraw"
    )
    assert said in plain.stderr and _status(url, record_id) == "verified", plain.stderr
    direct = tunecache("token", "revoke", leaked, "--withdraw", "--db", server.db)
    assert direct.returncode == 0, direct.stderr
    assert "withdrew 1 record standing on its word" in direct.stderr, direct.stderr
    assert "disputed, each checked again by another verifier" in direct.stderr, direct.stderr
    assert "still standing" not in direct.stderr and _status(url, record_id) == "disputed"


def test_a_finding_authenticated_before_a_withdrawal_and_stored_after_it_is_refused(
    database: tuple[str, Path | None],
) -> None:
    """The leaked verifier's pass of an accomplice's record, on a lease run out (a revocation
    releases live leases only), authenticated before the withdrawal committed and stored after
    it: the record was verified on the revoked token's word and served. A finding now reads its
    token behind its key's lock, as an upload does."""
    from cache_server import tokens, trust
    from cache_server.models import RecordRow
    from cache_server.queries import add_record

    url, _ = database
    sessions = migrated_sessions(url)
    with sessions() as session:
        _, accomplice = tokens.issue(session, name="accomplice", scope="write")
        secret, leaked = tokens.issue(session, name="leaked-verifier", scope="verify")
        key = make_key(m=64)
        record_id = add_record(session, key_hash=key.digest(), record=make_record(key),
                               uploader=accomplice).record_id  # fmt: skip
        session.commit()
        leaked_id = leaked.id
    with sessions() as request:
        claimed = trust.claim(request, worker="m", token_id=leaked_id, device_arch=CPU.arch,
                              backends=["tvm"], lease_seconds=0.001)  # fmt: skip
        assert claimed is not None and claimed.id == record_id
        request.commit()
        authenticated_then_withdrawn(sessions, request, secret=secret, token_id=leaked_id)
        with pytest.raises(tokens.Revoked, match="no finding was stored"):
            trust.finish(request, record_id=record_id, worker="m", token_id=leaked_id,
                         verifier="leaked-verifier", result=_passed("m", 0.001))  # fmt: skip
        request.rollback()
    with sessions() as session:
        row = session.get(RecordRow, record_id)
        assert row is not None and row.status == "pending" and row.checked_by is None


def test_a_rotated_verify_tokens_twins_are_served_again_by_a_pass(server: LiveServer) -> None:
    """A verify token revoked without withdrawing (rotated) keeps its findings' standing: a twin
    it passed, disputed with its copy, is served again when another verifier passes the copy.
    Taken for withdrawn, each twin waited for a verification of its own."""
    url = server.url
    key = make_key(m=64)
    with Client(url, token=token(url, "alice", "write")) as client:
        first = client.upload(make_record(key, time_ms=1.0, config=knobs(1))).record_id
    with Client(url, token=token(url, "bob", "write")) as client:
        second = client.upload(make_record(key, time_ms=1.1, config=knobs(1))).record_id
    with Client(url, token=token(url, "old-verifier", "verify")) as client:
        _decide(client, "o", {first: True, second: True})
    httpx.delete(f"{url}/v1/tokens/{_token_id(url, 'old-verifier')}", headers=AUTH)  # rotated
    consumer = {"Authorization": f"Bearer {token(url, 'consumer', 'read')}"}
    assert post_dispute(url, first, consumer, dispute_body(key)).status_code == 200
    assert [_status(url, i) for i in (first, second)] == ["disputed", "disputed"]
    with Client(url, token=token(url, "new-verifier", "verify")) as client:
        task = client.claim_verification("n", **CLAIM)
        assert task is not None and task.record.id in (first, second)
        assert client.submit_verification(task.record.id, _passed("n", 1.0)).status == "verified"
    assert [_status(url, i) for i in (first, second)] == ["verified", "verified"]


def test_the_migration_counts_every_token_revoked_before_it_withdrawn(
    database: tuple[str, Path | None],
) -> None:
    """0021: which revoked tokens were withdrawn was not recorded before it. Taken for rotated,
    a token withdrawn before the upgrade had its made-up record served again by a copy's pass
    (found by a review); every revoked token is counted withdrawn, a live one not."""
    from alembic import command
    from sqlalchemy import text

    from cache_server import tokens
    from cache_server.db import make_engine, make_sessionmaker
    from cache_server.migrate import alembic_config, upgrade

    url, _ = database
    upgrade(url)
    with make_sessionmaker(make_engine(url))() as session:
        tokens.issue(session, name="admin", scope="admin")
        _, gone = tokens.issue(session, name="gone", scope="write")
        _, live = tokens.issue(session, name="live", scope="write")
        session.flush()
        tokens.revoke(session, token_id=gone.id, withdraw=True)
        session.commit()
        ids = {"gone": gone.id, "live": live.id}
    command.downgrade(alembic_config(url), "0020")
    upgrade(url)
    with make_engine(url).connect() as connection:
        rows = connection.execute(text("select id, revoked_at, withdrawn_at from tokens")).all()
    found = {i: (revoked, withdrawn) for i, revoked, withdrawn in rows}
    assert found[ids["gone"]][1] is not None and found[ids["gone"]][1] == found[ids["gone"]][0]
    assert found[ids["live"]] == (None, None)
