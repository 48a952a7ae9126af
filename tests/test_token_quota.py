"""A token's quota of stored bytes (cache_server.quota), on a real server over SQLite and
PostgreSQL: uploads, snapshot imports and artifacts charge their token what they store; past the
quota a 403 names it and nothing is stored; an admin token, and other tokens, are not held."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from cache_server.models import TokenRow
from cache_server.queries import record_row
from cache_server.quota import record_bytes
from tests.conftest import LiveServer, start_server
from tests.factories import AUTH, issue_token, make_key, make_record
from tunecache import Client, ServerError, key_for
from tunecache.artifacts import ArtifactIn
from tunecache.outbox import refused_for_good
from tunecache.schemas import RecordCreate
from tunecache.snapshot import SNAPSHOT_FORMAT
from tunecache.tokens import byte_size

QUOTA = 2**20  # the least the setting takes
NS: Final = "inductor.choices"
PART = "sys-abc|torch-2.13.0"


@pytest.fixture
def bounded(database: tuple[str, Path | None], tmp_path: Path) -> Iterator[LiveServer]:
    url, path = database
    live = start_server(url, path, tmp_path / "server.log",
                        env={"TUNECACHE_SERVER_TOKEN_BYTES": str(QUOTA)})  # fmt: skip
    yield live
    live.stop()


def big_record(m: int) -> RecordCreate:
    """A record of some 200 KB as sent (2,500 trials), charged some 370 KB as stored: two fit
    in the quota."""
    return make_record(make_key(m), trials=2500, passed=m % 2 == 0)


def sent(record: RecordCreate, name: str = "test-write") -> int:
    """What the server charges token ``name`` for ``record``: the row it stores, as it stores
    it (the row's digest names the token's id, 64 characters whatever it is)."""
    row = record_row(key_hash=record.key.digest(), record=record,
                     uploader=TokenRow(id=1, name=name, trusted=False))  # fmt: skip
    return record_bytes(row, record.trials)


def headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def post(url: str, token: str, record: RecordCreate) -> httpx.Response:
    return httpx.post(f"{url}/v1/records", json=record.model_dump(mode="json", by_alias=True),
                      headers=headers(token), timeout=60)  # fmt: skip


def stored_by(url: str, name: str) -> int:
    tokens = httpx.get(f"{url}/v1/tokens", headers=AUTH, timeout=30).json()["items"]
    (found,) = [t["stored_bytes"] for t in tokens if t["name"] == name]
    assert isinstance(found, int)
    return found


def record_count(url: str) -> int:
    count: int = httpx.get(f"{url}/health", timeout=10).json()["records"]
    return count


def test_concurrent_uploads_stop_at_the_quota_and_nothing_refused_is_stored(
    bounded: LiveServer,
) -> None:
    """Eight clients of one write token send 24 records of 200 KB at once (4.8 MB, with records
    that fail validation: stored all the same): what is stored fits the quota, the token's usage
    is exactly what it stored, and each refusal is a 403 naming the quota and its setting."""
    url = bounded.url
    mallory = issue_token(url, "write")
    records = [big_record(m) for m in range(1, 25)]
    answers: dict[int, httpx.Response] = {}

    def send(start: int) -> None:
        for i in range(start, len(records), 8):
            answers[i] = post(url, mallory, records[i])

    threads = [threading.Thread(target=send, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    kept = [i for i, answer in answers.items() if answer.status_code == 201]
    refused = [answer for answer in answers.values() if answer.status_code != 201]
    assert kept and refused and len(kept) + len(refused) == 24
    assert {answer.status_code for answer in refused} == {403}, refused[0].text
    detail = refused[0].json()["detail"]
    assert "TUNECACHE_SERVER_TOKEN_BYTES" in detail and "'test-write'" in detail, detail
    assert "1.00 MiB" in detail and "none of it was stored" in detail, detail
    usage = stored_by(url, "test-write")
    assert usage == sum(sent(records[i]) for i in kept) <= QUOTA
    assert usage > QUOTA - max(sent(r) for r in records)  # it was filled, not refused early
    assert record_count(url) == len(kept)
    # another write token has a quota of its own; an admin token has none
    assert post(url, issue_token(url, "write"), big_record(100)).status_code == 201
    for m in range(200, 207):
        assert httpx.post(f"{url}/v1/records", headers=AUTH, timeout=60,
                          json=big_record(m).model_dump(mode="json", by_alias=True)
                          ).status_code == 201  # fmt: skip
    assert stored_by(url, "bootstrap") > QUOTA
    assert record_count(url) == len(kept) + 8


def test_a_record_sent_again_at_the_quota_is_answered_and_not_charged(
    bounded: LiveServer,
) -> None:
    """An outbox that lost its answer sends the record again: the server has it, so the token
    is not charged twice, and a full quota does not refuse it."""
    url = bounded.url
    token = issue_token(url, "write")
    first = big_record(2)
    assert post(url, token, first).status_code == 201
    m = 4
    while post(url, token, big_record(m)).status_code == 201:
        m += 2
    full = stored_by(url, "test-write")
    # the token sees its own usage; a token just made has stored nothing (they said null)
    me = httpx.get(f"{url}/v1/whoami", headers=headers(token), timeout=30).json()["token"]
    assert me["stored_bytes"] == full
    made = httpx.post(f"{url}/v1/tokens", json={"name": "fresh", "scope": "write"},
                      headers=AUTH, timeout=30).json()  # fmt: skip
    assert made["info"]["stored_bytes"] == 0
    again = post(url, token, first)
    assert again.status_code == 200, again.text
    assert stored_by(url, "test-write") == full
    # token list shows each token's usage, through the server and on the database
    ways = [["--server", url]] + ([["--db", bounded.db]] if bounded.db_path else [])
    for way in ways:
        listed = subprocess.run([sys.executable, "-m", "tunecache_cli", "token", "list", *way],
                                capture_output=True, text=True, timeout=120)  # fmt: skip
        header, _, *rows = listed.stdout.splitlines()
        assert header.split()[-1] == "stored", listed.stdout
        (row,) = [r for r in rows if " test-write " in r]
        assert row.endswith(byte_size(full)) and byte_size(full).endswith("KiB"), listed.stdout


def test_an_upload_past_the_quota_is_refused_before_it_is_written(bounded: LiveServer) -> None:
    """A token at its quota is refused before its record is written, not after: PostgreSQL's
    sequence counts every insert, rolled back or not, and the next record stored takes the
    next id. (Written and rolled back, two clients sending a 7.5 MB record in a loop left
    486 MiB of dead rows in 90 s.)"""
    if bounded.db_path is not None:
        pytest.skip("SQLite takes the next id from the rows stored: a rolled back insert "
                    "leaves no trace there")  # fmt: skip
    url = bounded.url
    token = issue_token(url, "write")
    m, last = 2, 0
    while (answer := post(url, token, big_record(m))).status_code == 201:
        last, m = answer.json()["record_id"], m + 2
    assert answer.status_code == 403, answer.text
    for _ in range(3):
        assert post(url, token, big_record(m)).status_code == 403
    other = post(url, issue_token(url, "write"), big_record(1))
    assert other.json()["record_id"] == last + 1, other.text


def test_a_refused_upload_waits_in_the_outbox(bounded: LiveServer, own_outbox: Path) -> None:
    """A 403 of the quota is not the record's fault: the client's upload raises it, and the
    outbox keeps the record for a later push rather than setting it aside as refused."""
    url = bounded.url
    token = issue_token(url, "write")
    with Client(url, token=token) as client:
        m = 2
        while True:
            try:
                client.upload(big_record(m))
            except ServerError as exc:
                assert exc.status_code == 403 and "quota" in str(exc), exc
                assert not refused_for_good(exc)
                break
            m += 2
        assert client.upload_later(big_record(m + 2))
        assert client.drain(30)
    waiting = [p for p in own_outbox.rglob("*") if p.is_file() and "rejected" not in p.parts]
    assert len(waiting) == 1, list(own_outbox.rglob("*"))


def _group(tag: int) -> dict[str, Any]:
    """An Inductor choice group of some 140 KB: 1,024 choices of long names."""
    return {"op": "mm", "inputs": f"[{tag}]", "precision": "highest",
            "timings": {f"c-{i}-" + "x" * 128: 1.0 for i in range(1024)}}  # fmt: skip


def _items(first: int, count: int, *, score: float) -> list[ArtifactIn]:
    return [ArtifactIn(namespace=NS, partition=PART, key=f"k{n}", value=_group(n),
                       score=score) for n in range(first, first + count)]  # fmt: skip


def test_artifacts_are_charged_what_they_write(bounded: LiveServer) -> None:
    """Items written are charged; items kept (the token's stored copy scores better) are not;
    a batch past the quota is refused whole."""
    url = bounded.url
    token = issue_token(url, "write")
    with Client(url, token=token) as client:
        assert client.put_artifacts(_items(0, 3, score=1.0)).stored == 3
        used = stored_by(url, "test-write")
        assert 3 * 140_000 < used < QUOTA
        assert client.put_artifacts(_items(0, 3, score=2.0)).kept == 3  # worse: nothing written
        assert stored_by(url, "test-write") == used
        with pytest.raises(ServerError) as refused:
            client.put_artifacts(_items(3, 12, score=1.0))
        assert refused.value.status_code == 403 and "these 12 items" in str(refused.value)
        assert stored_by(url, "test-write") == used
        held = client.get_artifacts(NS, PART)
        assert len(held) == 3
    if bounded.db_path is None:  # PostgreSQL's sequence counts every insert, rolled back or not
        with Client(url, token=issue_token(url, "write")) as other:
            assert other.put_artifacts(_items(50, 1, score=1.0)).stored == 1
            (mine,) = [a for a in other.get_artifacts(NS, PART) if a.key == "k50"]
        # ids past the three held: three of the re-put that kept them (an upsert takes its id
        # first), the refused batch's, then this one. The batch stopped at its first item past
        # the quota (some 4 fit), not written and rolled back whole (a token at its quota
        # doing a batch's whole work on every put)
        assert mine.id - max(a.id for a in held) - 3 - 1 < 12
    with Client(url, token=token) as client:
        # an unscored item sent again unchanged is not written again, nor charged (a tune sends
        # its workload each run); changed, it is
        unscored = ArtifactIn(namespace=NS, partition=PART, key="u", value=_group(99))
        assert client.put_artifacts([unscored]).stored == 1
        once = stored_by(url, "test-write")
        assert client.put_artifacts([unscored]).kept == 1
        assert stored_by(url, "test-write") == once > used
        changed = unscored.model_copy(update={"value": _group(98)})
        assert client.put_artifacts([changed]).stored == 1
        assert stored_by(url, "test-write") - once == once - used


def test_jobs_are_charged_and_a_full_token_may_still_fail_its_jobs(bounded: LiveServer) -> None:
    """A write token created jobs, claimed and failed each at once (a job failed is no longer
    open), 30 KB a job, never charged. Now each new job is charged; a failure's error too, but
    never refused: a token at its quota still gives back the jobs it holds."""
    url = bounded.url
    token = issue_token(url, "write")
    made = []
    with Client(url, token=token) as client:
        for m in range(1, 10_000):
            try:
                made.append(client.create_job(make_key(m)).job.id)
            except ServerError as exc:
                assert exc.status_code == 403 and "this job" in str(exc), exc
                break
        assert 100 < len(made) < 2000  # a job and its key: about 2 KB
        job = client.claim_job("w", device_arch="cpu-avx2", backends=("tvm",))
        assert job is not None
        failed = httpx.post(f"{url}/v1/jobs/{job.id}/fail", headers=headers(token), timeout=30,
                            json={"worker": "w", "error": "x" * 4000})  # fmt: skip
        assert failed.status_code == 200, failed.text
    assert stored_by(url, "test-write") > QUOTA - 2048


def test_a_snapshot_import_stops_at_the_quota(bounded: LiveServer) -> None:
    """An import past the quota stores its records, in the order it stores them (by key), up
    to the first that does not fit, which the 403 names; the same import sent again stores and
    charges nothing more. (Its chunks ended by the clock alone: a chunk that did not fit was
    refused whole, so what was stored changed run to run: on PostgreSQL, none of the nine
    records the first time and two the second.)"""
    url = bounded.url
    token = issue_token(url, "write")
    records = [big_record(m) for m in range(2, 20, 2)]
    document = {"format": SNAPSHOT_FORMAT, "filters": {"device_arch": "cpu-avx2"},
                "records": [r.model_dump(mode="json", by_alias=True) for r in records]}  # fmt: skip
    order = sorted(range(len(records)), key=lambda i: records[i].key.digest())
    fit = total = 0
    while total + sent(records[order[fit]]) <= QUOTA:
        total += sent(records[order[fit]])
        fit += 1
    assert 0 < fit < len(records)
    for _ in range(2):  # sent again: nothing stored or charged twice
        refused = httpx.post(f"{url}/v1/snapshot", json=document, headers=headers(token),
                             timeout=120)  # fmt: skip
        assert refused.status_code == 403, refused.text
        detail = refused.json()["detail"]
        assert "TUNECACHE_SERVER_TOKEN_BYTES" in detail
        assert f"records[{order[fit]}] would store" in detail, detail
        assert (record_count(url), stored_by(url, "test-write")) == (fit, total)
    small = {
        **document,
        "records": [make_record(make_key(1000)).model_dump(mode="json", by_alias=True)],
    }
    assert httpx.post(f"{url}/v1/snapshot", json=small, headers=headers(token),
                      timeout=60).json()["imported"] == 1  # fmt: skip


def test_a_record_twice_in_an_import_is_stored_and_charged_once(bounded: LiveServer) -> None:
    """A snapshot that holds a record twice stores it once, charged once: with room for one
    copy and not two, the import goes through (it was refused, naming the second copy)."""
    url = bounded.url
    token = issue_token(url, "write")
    assert post(url, token, big_record(2)).status_code == 201
    room = QUOTA - stored_by(url, "test-write")
    twice = big_record(4)
    assert sent(twice) <= room < 2 * sent(twice)
    document = {"format": SNAPSHOT_FORMAT, "filters": {"device_arch": "cpu-avx2"},
                "records": [twice.model_dump(mode="json", by_alias=True)] * 2}  # fmt: skip
    answer = httpx.post(f"{url}/v1/snapshot", json=document, headers=headers(token), timeout=60)
    assert answer.status_code == 200 and answer.json()["imported"] == 1, answer.text
    assert stored_by(url, "test-write") == QUOTA - room + sent(twice)
    assert record_count(url) == 2


@pytest.mark.slow
def test_a_daemon_whose_token_is_at_its_quota_stops_claiming(
    bounded: LiveServer, own_outbox: Path
) -> None:
    """Its tuned record refused (403), the daemon gives the job back and stops: every job it
    tuned next would be refused alike (it tuned each and failed it, an attempt each; without
    --once, on and on). The
    record waits in its outbox; the next job stays queued for another worker."""
    url = bounded.url
    token = issue_token(url, "write")
    m = 2
    while post(url, token, big_record(m)).status_code == 201:
        m += 2
    while post(url, token, make_record(make_key(m))).status_code == 201:  # to the last KiB
        m += 2
    with Client(url) as admin:
        jobs = [admin.create_job(key_for("matmul", "tvm", {"M": n, "N": 16, "K": 16}, "float32"),
                                 priority=-n).job for n in (16, 32)]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "tunecache_cli", "daemon", "--once", "--server", url,
         "--trials", "2", "--workers", "1"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "TUNECACHE_TOKEN": token},
    )  # fmt: skip
    assert done.returncode == 4, done.stderr
    assert "TUNECACHE_SERVER_TOKEN_BYTES" in done.stderr and "Traceback" not in done.stderr
    with Client(url) as admin:
        states = {job.id: (job.state, job.attempts) for job in admin.list_jobs().items}
    # given back (queued again for another worker, an attempt spent); the next one not claimed
    assert states == {jobs[0].id: ("queued", 1), jobs[1].id: ("queued", 0)}, done.stderr
    waiting = [p for p in own_outbox.rglob("*") if p.is_file() and "rejected" not in p.parts]
    assert len(waiting) == 1, done.stderr
