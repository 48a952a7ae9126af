"""What one answer may send: a listing at most the server's ``answer_bytes`` of stored JSON (a
write token's 256 KiB configs made ``GET /v1/records?limit=1000`` up to 256 MB to build and send),
a snapshot export at most its ``snapshot_bytes`` (else a 422 saying to narrow it: it was every
winner of an arch, however large). A real server on loopback, SQLite and PostgreSQL (the sizes
are computed by each database), with budgets of 1 and 4 KiB so that ordinary records and
artifacts fill them; the clients page through whole."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cache_server.db import make_sessionmaker
from cache_server.migrate import prepare
from cache_server.queries import add_record, list_records
from tests.conftest import LiveServer, start_server
from tests.factories import AUTH, make_key, make_record
from tests.test_artifacts import NS, PART, item, tag
from tunecache.client import Client
from tunecache.pages import fetch_first
from tunecache.report.collect import fetch_records

BUDGET = 8192  # bytes of stored JSON a listing may send
SNAPSHOT = 4096  # a snapshot's


@pytest.fixture
def tight_server(database: tuple[str, Path | None], tmp_path: Path) -> Iterator[LiveServer]:
    url, path = database
    live = start_server(url, path, tmp_path / "server.log",
                        env={"TUNECACHE_SERVER_ANSWER_BYTES": str(BUDGET),
                             "TUNECACHE_SERVER_SNAPSHOT_BYTES": str(SNAPSHOT)})  # fmt: skip
    yield live
    live.stop()


def test_a_listing_holds_the_configs_its_budget_allows_and_pages_on(
    tight_server: LiveServer,
) -> None:
    url = tight_server.url
    ids = []
    for m in range(40, 70):
        body = make_record(make_key(m=m), trials=0).model_dump(mode="json", by_alias=True)
        answer = httpx.post(f"{url}/v1/records", json=body, headers=AUTH, timeout=30)
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["record_id"])
    page = httpx.get(f"{url}/v1/records", params={"limit": 1000}, timeout=30).json()
    assert page["count"] == 30
    assert 1 < len(page["items"]) < 30  # cut short, newest first
    assert [r["id"] for r in page["items"]] == sorted(ids, reverse=True)[: len(page["items"])]
    # The dashboard's index (100 rows a page): as many, says how many it leaves out, and its
    # "next" starts right after them, so following it shows every record once.
    html = httpx.get(f"{url}/", params={"all": "true"}, timeout=30).text
    shown = len(re.findall(r'">record \d+<', html))
    assert 1 < shown < 30 and f"1–{shown} of 30" in html
    assert f"shows {30 - shown} rows fewer than a page holds" in html
    seen: list[str] = []
    while True:
        seen += re.findall(r'">record (\d+)<', html)
        following = re.search(r'start=(\d+)">next<', html)
        if following is None:
            break
        html = httpx.get(f"{url}/", params={"all": "true", "start": following[1]}, timeout=30).text
    assert sorted(map(int, seen)) == sorted(ids)
    with Client(url) as client:
        assert sorted(r.id for r in fetch_records(client)) == sorted(ids)  # each once
        first = fetch_first(client, 20, kernel="matmul")
    assert first.count == 30 and [r.id for r in first.items] == sorted(ids, reverse=True)[:20]


def test_a_page_holds_one_record_whatever_its_size(database: tuple[str, Path | None]) -> None:
    engine = prepare(database[0])
    with make_sessionmaker(engine)() as session:
        for m in (40, 48, 56):
            record = make_record(make_key(m=m), trials=0)
            add_record(session, key_hash=record.key.digest(), record=record)
        session.commit()
        items, count = list_records(session, budget=1)
        whole, _ = list_records(session)
    engine.dispose()
    assert count == 3 and [r.id for r in items] == [whole[0].id]


def test_an_artifact_page_holds_what_its_budget_allows_and_pages_on(
    tight_server: LiveServer,
) -> None:
    many = [item(f"k{i}", i) for i in range(300)]
    with Client(tight_server.url) as client:
        assert client.put_artifacts(many).stored == 300
        page = httpx.get(f"{tight_server.url}/v1/artifacts",
                         params={"namespace": NS, "partition": PART}, timeout=30).json()  # fmt: skip
        assert 1 < len(page["items"]) < 300 and page["next_after"] == page["items"][-1]["id"]
        assert sum(len(json.dumps(a["value"]).encode()) for a in page["items"]) <= BUDGET
        got = client.get_artifacts(NS, PART)  # pages on by next_after
    assert sorted(int(tag(a.value)) for a in got) == list(range(300))


def test_a_snapshot_over_the_servers_bound_is_a_422_saying_to_narrow_it(
    tight_server: LiveServer,
) -> None:
    url = tight_server.url
    for key in [make_key(m=40), make_key(m=48), *(make_key(kernel="softmax", m=m)
                                                   for m in (8, 16, 32, 64))]:  # fmt: skip
        body = make_record(key, trials=0).model_dump(mode="json", by_alias=True)
        assert (
            httpx.post(f"{url}/v1/records", json=body, headers=AUTH, timeout=30).status_code == 201
        )
    arch = make_key().device.arch
    whole = httpx.get(f"{url}/v1/snapshot", params={"device_arch": arch}, timeout=30)
    assert whole.status_code == 422, whole.text
    assert "TUNECACHE_SERVER_SNAPSHOT_BYTES" in whole.text and "narrow it" in whole.text
    narrowed = httpx.get(f"{url}/v1/snapshot", params={"device_arch": arch, "kernel": "matmul"},
                         timeout=30)  # fmt: skip
    assert narrowed.status_code == 200, narrowed.text
    assert sorted(r["key"]["problem"]["M"] for r in narrowed.json()["records"]) == [40, 48]


def test_a_page_past_the_last_row_says_so(server: LiveServer) -> None:
    """``/?start=100`` over 2 winners said "No winners match these filters" though they do."""
    with Client(server.url) as client:
        for m in (40, 48):
            client.upload(make_record(make_key(m=m), trials=0))
    html = httpx.get(f"{server.url}/", params={"start": 100}, timeout=30).text
    assert "Nothing from row 101: there are 2 rows" in html and "match these filters" not in html
    jobs = httpx.get(f"{server.url}/ui/jobs", timeout=30).text
    assert "No jobs." in jobs
    with Client(server.url) as client:
        client.create_job(make_key(m=56))
    one = httpx.get(f"{server.url}/ui/jobs", params={"start": 50}, timeout=30).text
    assert "Nothing from row 51: there is 1 row;" in one  # it said "there are 1"


def test_a_job_listing_holds_what_its_budget_allows_and_pages_on(
    tight_server: LiveServer,
) -> None:
    """``GET /v1/jobs`` and the dashboard's queue sent every job asked for, whatever their keys
    and errors held (a write token's jobs of 13 KB keys: 17 MB a page of 1,000); now as many as
    ``answer_bytes`` holds, and ``pretune`` reads the whole queue by the counts received."""
    from tunecache_cli.job_reads import all_jobs

    url = tight_server.url
    with Client(url) as client:
        queued = {client.create_job(make_key(m=m)).job.key_hash for m in range(40, 70)}
        page = httpx.get(f"{url}/v1/jobs", params={"limit": 1000}, timeout=30)
        assert page.status_code == 200 and page.json()["count"] == 30
        listed = page.json()["items"]
        assert 1 < len(listed) < 30
        assert sum(len(json.dumps(j["key"], separators=(",", ":"))) for j in listed) <= BUDGET
        assert [j["id"] for j in listed] == sorted(j["id"] for j in listed)  # oldest first
        assert set(all_jobs(client)) == queued  # paged on: each once
    html = httpx.get(f"{url}/ui/jobs", timeout=30).text
    assert f"shows {30 - len(listed)} rows fewer than a page holds" in html
