"""A lookup ranking a large shape bucket ranks in a lane of its own, through a real server.

An anonymous client's lookups of a bucket of 2,000 winners (80 ms each) held both of the API's
slots of a process, and 137 of 148 lookups of another client were refused. A lookup about to rank
more than ``RANK_FREE`` winners now moves to the load shedding's ranking lane from its worker
thread (the middleware's admission itself is tested in test_shedding); here, through a real
uvicorn server on loopback, such a lookup is still answered by its rule.
"""

from __future__ import annotations

import httpx

from cache_server.lookup import RANK_FREE
from tests.conftest import LiveServer
from tests.factories import AUTH, make_key, make_record
from tunecache import Client
from tunecache.schemas import KeyModel


def test_a_lookup_ranking_a_large_bucket_is_answered_by_its_rule(server: LiveServer) -> None:
    token = AUTH["Authorization"].removeprefix("Bearer ")
    with Client(server.url, token=token) as client:
        for m in range(1025, 1026 + RANK_FREE):  # one bucket (M up to 2048), one more than free
            client.upload(make_record(make_key(m)))
    wanted = KeyModel.from_key(make_key(1500)).model_dump(mode="json", by_alias=True)
    for policy in ("strict", "any"):  # a strict miss ranks the bucket too
        answer = httpx.post(f"{server.url}/v1/lookup", json={"key": wanted, "policy": policy},
                            timeout=30)  # fmt: skip
        assert answer.status_code == 200, answer.text
        assert answer.json()["match"] == "bucket"
