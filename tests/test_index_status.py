"""The dashboard's index says what the record page says of each record: whether a verifier
vouches for it (pending, verified, disputed), who uploaded it, and how many of the trials its
uploader claims the server stores."""

from __future__ import annotations

import re

import httpx

from tests.conftest import LiveServer
from tests.factories import AUTH, issue_token, make_key, make_record
from tunecache.schemas import RecordCreate, SearchModel


def _upload(url: str, record: RecordCreate, token: str) -> int:
    answer = httpx.post(f"{url}/v1/records", json=record.model_dump(mode="json", by_alias=True),
                        headers={"Authorization": f"Bearer {token}"}, timeout=30)  # fmt: skip
    assert answer.status_code == 201, answer.text
    record_id: int = answer.json()["record_id"]
    return record_id


def _row(html: str, record_id: int) -> str:
    """The index's table row that links to record ``record_id``."""
    for row in re.findall(r"<tr class=.*?</tr>", html, flags=re.S):
        if f'/ui/records/{record_id}"' in row:
            return str(row)
    raise AssertionError(f"no row of record {record_id}")


def test_the_index_says_pending_or_verified_and_who_uploaded(server: LiveServer) -> None:
    """A pending record of a write token claiming 1000x speedups stood on the index like any
    other: no status, no uploader (its record page said "pending"). Each row now says both, as
    the record page does, with the record page's trust line as its title."""
    writer = issue_token(server.url, "write")  # named "test-write"; not trusted
    claimed = make_record(make_key(m=32), time_ms=0.001, trials=0).model_copy(
        update={"search": SearchModel(strategy="random", trials=8, seconds=1.0)}
    )
    pending = _upload(server.url, claimed, writer)
    verified = _upload(server.url, make_record(make_key(m=64), time_ms=1.0, trials=3),
                       AUTH["Authorization"].removeprefix("Bearer "))  # fmt: skip
    statuses = {i: httpx.get(f"{server.url}/v1/records/{i}", headers=AUTH).json()["status"]
                for i in (pending, verified)}  # fmt: skip
    assert statuses[pending] == "pending"
    html = httpx.get(f"{server.url}/", headers=AUTH, timeout=30).text
    row = _row(html, pending)
    assert '<span class="badge ">pending</span>' in row and "by test-write" in row
    assert "pending: validated by its uploader only (uploaded by test-write; not verified)" in row
    other = _row(html, verified)
    assert f">{statuses[verified]}</span>" in other
    assert "<th>Status</th>" in html
    # Columns still line up: as many cells in each row as headers.
    headers = len(re.findall(r"<th[ >]", html))
    assert len(re.findall(r"<td[ >]", row)) == headers == len(re.findall(r"<td[ >]", other))


def test_the_index_says_how_many_claimed_trials_are_stored(server: LiveServer) -> None:
    """The index's Trials column showed the uploader's ``search.trials`` (8) where the server
    stores none (the record page: "8 trials; …; 0 stored")."""
    claimed = make_record(make_key(m=32), trials=0).model_copy(
        update={"search": SearchModel(strategy="random", trials=8, seconds=1.0)}
    )
    token = AUTH["Authorization"].removeprefix("Bearer ")
    none_kept = _upload(server.url, claimed, token)
    all_kept = _upload(server.url, make_record(make_key(m=64), trials=3), token)
    html = httpx.get(f"{server.url}/", headers=AUTH, timeout=30).text
    assert '<td class="num trials">8 claimed, 0 stored</td>' in _row(html, none_kept)
    assert '<td class="num trials">3</td>' in _row(html, all_kept)
    record_page = httpx.get(f"{server.url}/ui/records/{none_kept}", headers=AUTH).text
    assert "8 trials;" in record_page and "0 stored." in record_page
