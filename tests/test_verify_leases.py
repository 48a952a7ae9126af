"""A verifier's lease is its worker's *and* its token's, as a job's is: another verify token
naming the same worker can neither settle it nor be handed it, and a revoked token's leases go
back to the queue at once (each on SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer
from tests.factories import AUTH, CPU, knobs, make_key, make_record
from tests.test_trust import _passed, token
from tunecache import Client, ServerError


def _uploaded(url: str, m: int) -> int:
    with Client(url) as client:
        return client.upload(make_record(make_key(m=m), config=knobs(1))).record_id


def _token_id(url: str, name: str) -> int:
    listed = httpx.get(f"{url}/v1/tokens", headers=AUTH).json()
    return next(t["id"] for t in listed["items"] if t["name"] == name)


def test_another_verify_token_naming_the_same_worker_cannot_settle_a_lease(
    any_server: LiveServer,
) -> None:
    url = any_server.url
    record_id = _uploaded(url, 40)
    with (
        Client(url, token=token(url, "honest", "verify")) as honest,
        Client(url, token=token(url, "other", "verify")) as other,
    ):
        task = honest.claim_verification("w1", device_arch=CPU.arch, backends=["tvm"])
        assert task is not None and task.record.id == record_id
        # The same worker name under another token: not handed the lease, nor may settle it.
        assert other.claim_verification("w1", device_arch=CPU.arch, backends=["tvm"]) is None
        with pytest.raises(ServerError, match="under this token") as refused:
            other.submit_verification(record_id, _passed("w1", 1.0))
        assert refused.value.status_code == 409
        assert honest.submit_verification(record_id, _passed("w1", 2.0)).status == "verified"


def test_a_revoked_verifiers_lease_is_claimable_at_once(
    database: tuple[str, Path | None], tmp_path: Path
) -> None:
    """Revoking a verify token gave back its jobs' leases but kept its records leased until the
    lease ran out (an hour by default): no other verifier could check them meanwhile."""
    from cache_server import tokens, trust
    from cache_server.db import make_sessionmaker
    from cache_server.migrate import prepare
    from cache_server.queries import add_record

    engine = prepare(database[0])
    try:
        with make_sessionmaker(engine).begin() as session:
            _, gone = tokens.issue(session, name="gone", scope="verify")
            _, kept = tokens.issue(session, name="kept", scope="verify")
            record = make_record(make_key(m=41))
            add_record(session, key_hash=record.key.digest(), record=record)
            first = trust.claim(session, worker="w", token_id=gone.id, device_arch=CPU.arch,
                                backends=["tvm"], lease_seconds=3600)  # fmt: skip
            assert first is not None and first.verify_attempts == 1
            assert trust.claim(session, worker="v", token_id=kept.id, device_arch=CPU.arch,
                               backends=["tvm"], lease_seconds=60) is None  # fmt: skip
            tokens.revoke(session, token_id=gone.id)
            again = trust.claim(session, worker="v", token_id=kept.id, device_arch=CPU.arch,
                                backends=["tvm"], lease_seconds=60)  # fmt: skip
            assert again is not None and again.id == first.id
            assert again.verify_attempts == 1  # the revoked token's attempt was refunded
            # A claim that passed its token check just before the revocation leases nothing.
            assert trust.claim(session, worker="w", token_id=gone.id, device_arch=CPU.arch,
                               backends=["tvm"], lease_seconds=60) is None  # fmt: skip
    finally:
        engine.dispose()


def test_a_claim_racing_a_revocation_never_outlives_it(
    database: tuple[str, Path | None],
) -> None:
    """PostgreSQL, read committed: a claim that read the token live while a revocation was in
    flight leased the record after the revocation's release had passed it over, and the lease
    outlived the token. The claim now waits for the revocation, then leases nothing; a job's
    claim likewise."""
    import threading

    from cache_server import jobs, tokens, trust
    from cache_server.db import make_sessionmaker
    from cache_server.migrate import prepare
    from cache_server.queries import add_record

    if database[1] is not None:
        pytest.skip("SQLite serialises writers: the race needs PostgreSQL")
    engine = prepare(database[0])
    sessions = make_sessionmaker(engine)
    try:
        with sessions.begin() as session:
            _, gone = tokens.issue(session, name="gone", scope="verify")
            _, admin = tokens.issue(session, name="admin", scope="admin")
            record = make_record(make_key(m=42))
            add_record(session, key_hash=record.key.digest(), record=record)
            key = make_key(m=43)
            jobs.enqueue(session, key)
            gone_id = gone.id
        claimed: list[object] = []

        def claim_both() -> None:
            with sessions.begin() as racing:
                claimed.append(trust.claim(racing, worker="w", token_id=gone_id,
                                           device_arch=CPU.arch, backends=["tvm"],
                                           lease_seconds=3600))  # fmt: skip
                claimed.append(jobs.claim(racing, worker="w", token_id=gone_id, token_name="gone",
                                          lease_seconds=3600))  # fmt: skip

        revoking = sessions()
        tokens.revoke(revoking, token_id=gone_id)  # in flight: not committed yet
        racer = threading.Thread(target=claim_both)
        racer.start()
        racer.join(1.0)
        assert racer.is_alive()  # waiting for the revocation
        revoking.commit()
        revoking.close()
        racer.join(30)
        assert claimed == [None, None]
        with sessions.begin() as session:
            taken = trust.claim(session, worker="v", token_id=admin.id, device_arch=CPU.arch,
                                backends=["tvm"], lease_seconds=60)  # fmt: skip
            assert taken is not None
    finally:
        engine.dispose()


def test_a_verifier_stopped_mid_record_gives_it_back(
    any_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verifier stopped with Ctrl-C left its record leased (10 minutes by default), each stop
    spending one of its three attempts: a record three stops met was never verified. It is given
    back: claimable at once, the attempt refunded. Only by its worker and token, while leased."""
    from tuner.verify import Verifier, VerifierOptions

    url = any_server.url
    record_id = _uploaded(url, 42)

    def stopped(self: Verifier, task: object, harness: object) -> None:
        raise KeyboardInterrupt  # mid-way: the Ctrl-C a real run gets in its re-timing

    monkeypatch.setattr(Verifier, "finding", stopped)
    monkeypatch.setattr(Verifier, "arch", lambda self: CPU.arch)
    stops = token(url, "stops", "verify")
    for _ in range(4):  # past its three attempts: each refunded
        with Client(url, token=stops) as client:
            verifier = Verifier(client, VerifierOptions(backends=("tvm",), workers=1, once=True))
            with pytest.raises(KeyboardInterrupt):
                verifier.run()
    with (
        Client(url, token=token(url, "next", "verify")) as other,
        Client(url, token=stops) as first,
    ):
        task = other.claim_verification("w2", device_arch=CPU.arch, backends=["tvm"])
        assert task is not None and task.record.id == record_id
        for client, worker in ((first, "w2"), (other, "w3")):  # not this token's, nor worker's
            with pytest.raises(ServerError, match="not leased to worker") as refused:
                client.release_verification(record_id, worker)
            assert refused.value.status_code == 409
        assert other.release_verification(record_id, "w2").id == record_id
        assert other.claim_verification("w4", device_arch=CPU.arch, backends=["tvm"]) is not None


def test_a_check_longer_than_its_lease_keeps_the_record(
    any_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verifier's lease was never renewed: a check longer than it (a record disputed at 64
    problems, each compiled and validated anew) had the record claimed by another verifier
    meanwhile and its finding refused, an attempt spent each time. The lease is renewed while
    the check runs; only by its worker and token."""
    import threading
    import time

    from tuner.verify import Verifier, VerifierOptions

    url = any_server.url
    record_id = _uploaded(url, 43)
    taken: list[object] = []
    checking = threading.Event()
    other = Client(url, token=token(url, "other", "verify"))

    def slow(self: Verifier, task: object, harness: object) -> object:
        checking.set()
        time.sleep(3.0)  # past its 1 s lease: another verifier asks meanwhile
        try:  # checked outside: the check's own errors are findings
            other.heartbeat_verification(record_id, self.worker, lease_seconds=60)
        except ServerError as exc:
            taken.append(exc.status_code)
        return self._finding("unverifiable", error="checked slowly")

    def claims() -> None:
        checking.wait(timeout=60)
        time.sleep(1.8)
        taken.append(other.claim_verification("w2", device_arch=CPU.arch, backends=["tvm"]))

    monkeypatch.setattr(Verifier, "check", slow)
    monkeypatch.setattr(Verifier, "arch", lambda self: CPU.arch)
    with other, Client(url, token=token(url, "slow", "verify")) as client:
        verifier = Verifier(client, VerifierOptions(backends=("tvm",), workers=1, once=True,
                                                    lease_seconds=1.0))  # fmt: skip
        asking = threading.Thread(target=claims)
        asking.start()
        verifier.run()
        asking.join(timeout=30)
    assert taken == [None, 409]  # held, renewed: not handed to another, nor its to renew
    assert verifier.outcomes == {record_id: "unverifiable"}  # its finding stored


def test_only_a_live_lease_of_a_live_token_is_renewed(
    database: tuple[str, Path | None],
) -> None:
    """A renewal of a lapsed lease that crossed its token's revocation (which releases live
    leases only) held the record for a day for a token that may store no finding; a lease
    taken before leases had tokens was renewed by any verify token naming its worker."""
    from datetime import timedelta

    from cache_server import tokens, trust
    from cache_server.db import make_sessionmaker
    from cache_server.migrate import prepare
    from cache_server.models import RecordRow, utcnow
    from cache_server.queries import add_record

    engine = prepare(database[0])
    try:
        with make_sessionmaker(engine).begin() as session:
            _, mine = tokens.issue(session, name="mine", scope="verify")
            record = make_record(make_key(m=44))
            add_record(session, key_hash=record.key.digest(), record=record)
            row = trust.claim(session, worker="w", token_id=mine.id, device_arch=CPU.arch,
                              backends=["tvm"], lease_seconds=60)  # fmt: skip
            assert row is not None

            def renew() -> bool:
                return trust.renew_verification(session, record_id=row.id, worker="w",
                                                token_id=mine.id, lease_seconds=3600)  # fmt: skip

            assert renew()
            session.get(RecordRow, row.id).verify_expires_at = utcnow() - timedelta(seconds=1)
            session.flush()
            assert not renew()  # lapsed
            session.get(RecordRow, row.id).verify_expires_at = utcnow() + timedelta(seconds=60)
            session.get(RecordRow, row.id).verify_token_id = None
            session.flush()
            assert not renew()  # a lease of no token
            session.get(RecordRow, row.id).verify_token_id = mine.id
            session.flush()
            assert renew()
            tokens.revoke(session, token_id=mine.id)
            assert not renew()
    finally:
        engine.dispose()


def test_a_lease_refused_is_not_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    """A lost lease (409) was renewed, and warned of, every third of the lease until the check
    ended: nine warnings in 3 s at a 1 s lease. Refused, it is said once; a server that does not
    answer is asked again."""
    import logging
    import time
    from types import SimpleNamespace

    from tuner.polling import leased

    class Refusing:  # the client's calls, at a boundary we own
        def __init__(self, status: int) -> None:
            self.status, self.calls = status, 0

        def heartbeat_verification(self, *args: object, **kwargs: object) -> None:
            self.calls += 1
            raise ServerError("refused", status_code=self.status)

    task = SimpleNamespace(record=SimpleNamespace(id=7))  # a record to verify, as leased reads it
    for status in (409, 503):
        client = Refusing(status)
        caplog.clear()
        with (
            caplog.at_level(logging.WARNING, logger="tuner.daemon"),
            leased(client, task, "w", 0.3),  # type: ignore[arg-type]
        ):
            time.sleep(1.2)  # past three renewals
        said = [r for r in caplog.records if "record #7: lease not renewed" in r.getMessage()]
        if status == 409:
            assert (client.calls, len(said)) == (1, 1)
        else:
            assert client.calls >= 2 and len(said) == client.calls
