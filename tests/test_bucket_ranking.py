"""A lookup ranking a large shape bucket ranks in a lane of its own, through a real server.

An anonymous client's lookups of a bucket of 2,000 winners (80 ms each) held both of the API's
slots of a process, and 137 of 148 lookups of another client were refused. A lookup about to rank
more than ``RANK_FREE`` winners now moves to the load shedding's ranking lane from its worker
thread (the middleware's admission itself is tested in test_shedding); here, through a real
uvicorn server on loopback (in this process, to count the moves), such a lookup moves and is
still answered by its rule, and a lookup of a tuned key is answered without ranking, whatever
its version policy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from cache_server.api.shedding import LoadShedding
from cache_server.embedded import EmbeddedServer
from cache_server.lookup import RANK_FREE
from tests.factories import make_key, make_record
from tunecache import Client
from tunecache.schemas import KeyModel


def test_a_lookup_ranking_a_large_bucket_moves_and_is_answered_by_its_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    moved: list[str | None] = []
    move = LoadShedding.move

    async def counted(self: LoadShedding, answer: Any) -> str | None:
        moved.append(busy := await move(self, answer))
        return busy

    monkeypatch.setattr(LoadShedding, "move", counted)
    with EmbeddedServer(f"sqlite:///{tmp_path / 'cache.db'}") as live:
        token = live.issue_token("uploader", "write")
        with Client(live.url, token=token) as client:
            for m in range(1025, 1026 + RANK_FREE):  # one bucket (M to 2048), one more than free
                client.upload(make_record(make_key(m)))

        def lookup(m: int, policy: str) -> dict[str, Any]:
            wanted = KeyModel.from_key(make_key(m)).model_dump(mode="json", by_alias=True)
            answer = httpx.post(f"{live.url}/v1/lookup", json={"key": wanted, "policy": policy},
                                timeout=30)  # fmt: skip
            assert answer.status_code == 200, answer.text
            return dict(answer.json())

        for policy in ("strict", "any"):  # a strict miss ranks the bucket too
            assert lookup(1500, policy)["match"] == "bucket"
        assert moved == [None, None]  # each moved, a slot had
        for policy in ("strict", "compatible", "any"):  # a tuned key: its own winner, no ranking
            assert lookup(1030, policy)["match"] == "exact"
        assert len(moved) == 2
