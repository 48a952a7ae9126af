"""One uploader cannot hold the verifiers: a claim takes the uploader with the fewest records
awaiting verification first. Through a real server, on SQLite and PostgreSQL.

The audit: one write token uploaded three records of a 6000-cube matmul (each five minutes and
2.4 GB of a verifier's before it was rejected); the next honest record, uploaded after them, was
claimed fourth. Disputing its own records put them before every pending one too."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import LiveServer
from tests.factories import CPU, issue_token, knobs, make_key, make_record
from tests.test_trust import dispute_body
from tunecache import Client

pytestmark = pytest.mark.slow


def claim_ids(url: str, token: str, count: int) -> list[int | None]:
    with Client(url, token=token) as client:
        tasks = [client.claim_verification(f"v{i}", device_arch=CPU.arch, backends=["tvm"])
                 for i in range(count)]  # fmt: skip
    return [None if t is None else t.record.id for t in tasks]


def test_a_verifier_takes_the_uploader_with_fewest_waiting_first(any_server: LiveServer) -> None:
    url = any_server.url
    flood, honest, other = (issue_token(url, "write") for _ in range(3))
    with Client(url, token=flood) as client:
        flooded = [client.upload(make_record(make_key(m=64 + i), config=knobs(i + 1))).record_id
                   for i in range(4)]  # fmt: skip
        # Its own records disputed: a way past every pending record before.
        for i, record_id in enumerate(flooded[:2]):
            answer = httpx.post(f"{url}/v1/records/{record_id}/disputes", timeout=30,
                                headers={"Authorization": f"Bearer {flood}"},
                                json=dispute_body(make_key(m=64 + i)))  # fmt: skip
            assert answer.status_code == 200, answer.text
    with Client(url, token=honest) as client:
        first = client.upload(make_record(make_key(m=80), config=knobs(2))).record_id
    with Client(url, token=other) as client:
        theirs = [client.upload(make_record(make_key(m=90 + i), config=knobs(3))).record_id
                  for i in range(2)]  # fmt: skip

    verifier = issue_token(url, "verify")
    claimed = claim_ids(url, verifier, len(flooded) + 4)
    # The honest uploader (one waiting), then the other (two), each of theirs before the
    # flood's, whose disputed records come first among its own; then nothing is left.
    assert claimed[:3] == [first, theirs[0], theirs[1]], claimed
    assert claimed[3:] == [*flooded, None], claimed
    assert claimed[7:] == [None]
