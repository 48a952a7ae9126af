"""Choice groups merged from the server stay the server's: taken out when no longer served so,
never uploaded as this machine's own.

The audit: a hostile uploader's made-up timings (a slower choice ranked first) were merged by
``enable()``; once the server stopped serving them (the token revoked), the next process on that
cache folder still picked them (``fetched=0 merged=0``: the file kept them, and a merge never
replaced a group the file had), and ``upload()`` shared them again under the consumer's own token,
which nobody would revoke. Here: a real server with per-token copies and revocation, and a server
at the client's transport (as in ``tests/test_inductor_closed.py``) whose answer changes between
``enable()`` calls; the choice file holds groups as Inductor writes them (as in
``tests/test_inductor_cache.py``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.factories import issue_token
from tunecache.artifacts import ArtifactIn
from tunecache.client import Client
from tunecache.inductor import enable, upload
from tunecache.inductor.choices import (
    ChoiceGroup,
    merge_groups,
    own_groups,
    read_groups,
)
from tunecache.inductor.partition import partition
from tunecache.inductor.remote import TeamCache
from tunecache.inductor.served import MAX_RECORD_BYTES, read_record, record_path

INPUTS = "[('cpu', 'torch.float32', 32, 64)]"
# The teammate's honest times, and the made-up ones ranking the 2x slower choice first.
HONEST: dict[str, Any] = {"op": "packed_linear", "inputs": INPUTS, "precision": "highest",
          "timings": {"cpp_fast-c1": 0.01, "_mkl_slow-c2": 0.02}}  # fmt: skip
MADE_UP: dict[str, Any] = {**HONEST, "timings": {"cpp_fast-c1": 0.02, "_mkl_slow-c2": 0.001}}
LOCAL: dict[str, Any] = {**HONEST, "op": "addmm", "timings": {"a-1": 0.5, "b-2": 0.25}}


def write_as_inductor(path: Path, *values: dict[str, Any]) -> None:
    """The choice file as Inductor writes it after benchmarking ``values`` here."""
    cache: dict[str, Any] = {}
    for value in values:
        cache.setdefault(value["op"], {}).setdefault(value["inputs"], {})[value["precision"]] = {
            h: (math.inf if ms is None else ms) for h, ms in value["timings"].items()
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"system": {"hash": "h"}, "cache": cache}, indent=4))


def in_file(path: Path, value: dict[str, Any]) -> dict[str, float] | None:
    cache = json.loads(path.read_text())["cache"]
    found: dict[str, float] | None = (
        cache.get(value["op"], {}).get(value["inputs"], {}).get(value["precision"])
    )
    return found


def artifact(value: dict[str, Any], score: float) -> ArtifactIn:
    group = ChoiceGroup.from_value(value)
    assert group is not None
    return ArtifactIn(namespace="inductor.choices", partition=partition(), key=group.key(),
                      value=value, score=score)  # fmt: skip


def test_a_revoked_tokens_made_up_group_is_taken_out_never_relaundered_and_honest_returns(
    inductor_cache: Path, server: LiveServer
) -> None:
    hostile, consumer = issue_token(server.url, "write"), issue_token(server.url, "write")
    with Client(server.url) as team, Client(server.url, token=hostile) as them:
        assert team.put_artifacts([artifact(HONEST, 0.01)]).stored == 1
        assert them.put_artifacts([artifact(MADE_UP, 0.0)]).stored == 1  # served first
    first = enable(server.url)
    assert (first.fetched, first.merged) == (1, 1)
    assert in_file(inductor_cache, MADE_UP) == MADE_UP["timings"]
    # The consumer uploads what its Inductor timed: nothing; the merged copy is not its own.
    shared = upload(server.url, token=consumer)
    assert shared is not None and (shared.stored, shared.kept) == (0, 0)
    with Client(server.url) as team:
        (hostile_id,) = [t.id for t in team.list_tokens() if t.name == "test-write"]
        team.revoke_token(hostile_id)
        served = team.get_artifacts("inductor.choices", partition())
    assert [item.value for item in served] == [HONEST]  # no laundered copy under the consumer's
    # The next process on that cache folder: the made-up group out, the teammate's back.
    second = enable(server.url)
    assert in_file(inductor_cache, HONEST) == HONEST["timings"]
    assert (second.fetched, second.merged, second.removed) == (1, 1, 1)
    assert own_groups(inductor_cache) == []  # still the server's: not uploaded either


class Changing:
    """A server at the client's transport answering every artifact read with ``values`` (as
    ``Hostile`` in ``tests/test_inductor_closed.py``), or failing when ``values`` is ``None``."""

    def __init__(self, values: list[Any] | None) -> None:
        self.values = values

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.values is None:
            raise httpx.ConnectError("refused", request=request)
        params = dict(request.url.params)
        items = [{"namespace": params["namespace"], "partition": params["partition"],
                  "key": f"k{i}", "item": "", "value": value, "score": None, "id": i + 1,
                  "updated_at": "2025-01-01T00:00:00Z"}
                 for i, value in enumerate(self.values)]  # fmt: skip
        return httpx.Response(200, json={"items": items, "next_after": None})

    def team(self, *args: Any, **kwargs: Any) -> TeamCache:
        team = TeamCache("http://changing.test", "t", partition(), timeout=2.0)
        team.client.close()
        team.client = Client("http://changing.test", transport=httpx.MockTransport(self),
                             token="t", timeout=1.0)  # fmt: skip
        return team


def test_served_groups_follow_the_server_and_local_ones_are_never_touched(
    inductor_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tunecache.inductor

    server = Changing([MADE_UP, {**LOCAL, "timings": {"a-1": 0.001}}])
    monkeypatch.setattr(tunecache.inductor, "TeamCache", server.team)
    write_as_inductor(inductor_cache, LOCAL)
    first = enable("http://changing.test")
    assert first.merged == 1  # the local group is not replaced
    assert in_file(inductor_cache, MADE_UP) == MADE_UP["timings"]
    assert [g.to_value() for g in own_groups(inductor_cache)] == [LOCAL]
    server.values = None  # down: what it serves is not known, nothing is taken out
    with pytest.warns(tunecache.inductor.TeamCacheWarning):
        down = enable("http://changing.test")
    assert (down.reachable, down.merged) == (False, 0)
    assert in_file(inductor_cache, MADE_UP) == MADE_UP["timings"]
    server.values = [HONEST]  # served differently now: replaced
    replaced = enable("http://changing.test")
    assert in_file(inductor_cache, HONEST) == HONEST["timings"]
    assert (replaced.fetched, replaced.merged, replaced.removed, down.removed) == (1, 1, 1, 0)
    server.values = []  # no longer served: taken out; Inductor benchmarks that shape itself
    gone = enable("http://changing.test")
    assert in_file(inductor_cache, HONEST) is None
    assert (gone.fetched, gone.merged, gone.removed) == (0, 0, 1)
    assert in_file(inductor_cache, LOCAL) == LOCAL["timings"]
    assert read_record(inductor_cache) == set()


def test_groups_left_unread_at_the_timeout_take_nothing_out(
    inductor_cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The groups served are read and checked within the timeout too (a page of 1,000 groups
    of 1,000 choices took 1.9 s more to check, past a 1.5 s timeout): those not reached by
    then are left unread, and what the server serves is not known in full, so nothing merged
    before is taken out."""
    import time
    import types

    import tunecache.inductor

    server = Changing([MADE_UP])
    monkeypatch.setattr(tunecache.inductor, "TeamCache", server.team)
    assert enable("http://changing.test").merged == 1
    calls = iter(range(1_000_000))  # each look at the clock 100 s after the one before
    slow = types.SimpleNamespace(monotonic=lambda: time.monotonic() + 100 * next(calls))
    monkeypatch.setattr(tunecache.inductor, "time", slow)
    server.values = [HONEST]  # replaced on the server, the checks past the deadline
    with caplog.at_level("WARNING", logger="tunecache.inductor"):
        late = enable("http://changing.test")
    assert (late.fetched, late.merged, late.removed) == (0, 0, 0)
    assert in_file(inductor_cache, MADE_UP) == MADE_UP["timings"]
    assert "0 of 1 choice groups read within the timeout" in caplog.text


def test_a_merged_group_inductor_timed_again_is_its_own(
    inductor_cache: Path, server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tunecache.inductor

    served = ChoiceGroup.from_value({**MADE_UP, "timings": {"cpp_fast-c1": 0.001}})
    assert served is not None
    assert merge_groups(inductor_cache, [served], {"hash": "h"}) == 1
    assert own_groups(inductor_cache) == []
    result = upload(server.url)
    assert result is not None and result.stored == 0
    # A candidate lacked a time: Inductor benchmarked every one and wrote them into the group.
    write_as_inductor(inductor_cache, {**MADE_UP, "timings": {**HONEST["timings"],
                                                              "cpp_fast-c1": 0.011}})  # fmt: skip
    (retimed,) = own_groups(inductor_cache)
    assert retimed.timings == {**HONEST["timings"], "cpp_fast-c1": 0.011}
    result = upload(server.url)
    assert result is not None and result.stored == 1
    with Client(server.url) as client:
        (item,) = client.get_artifacts("inductor.choices", partition())
    assert isinstance(item.value, dict)
    assert item.value["timings"] == {**HONEST["timings"], "cpp_fast-c1": 0.011}
    # Re-timed here: never taken out, though the server serves it no more.
    monkeypatch.setattr(tunecache.inductor, "TeamCache", Changing([]).team)
    assert enable("http://changing.test").removed == 0
    assert [g.timings for g in read_groups(inductor_cache)] == [retimed.timings]


@pytest.mark.parametrize(
    "record",
    [
        b"{not json",
        b"[1, 2]",
        json.dumps({"format": "tunecache.inductor.served/1", "groups": [["x", "y"]]}).encode(),
        json.dumps({"format": "other", "groups": []}).encode(),
        b" " * (MAX_RECORD_BYTES + 1),
    ],
    ids=["garbage", "list", "not-hashes", "other-format", "too-large"],
)
def test_a_corrupt_record_means_nothing_merged(inductor_cache: Path, record: bytes) -> None:
    served = ChoiceGroup.from_value(MADE_UP)
    assert served is not None
    assert merge_groups(inductor_cache, [served], {"hash": "h"}) == 1
    assert read_record(inductor_cache) == {served.pair()}
    record_path(inductor_cache).write_bytes(record)
    assert read_record(inductor_cache) == set()
    assert [g.to_value() for g in own_groups(inductor_cache)] == [MADE_UP]
    assert [g.to_value() for g in read_groups(inductor_cache)] == [MADE_UP]


def test_a_merge_waits_for_another_processs_merge_of_the_same_file(inductor_cache: Path) -> None:
    """Two processes merging at once each wrote the record whole: a group one merged was left
    out of it, counted as this machine's own, and uploaded. The file and its record are read
    and written under one lock; a merge waits while another holds it."""
    group = ChoiceGroup.from_value(MADE_UP)
    assert group is not None
    waited, finished = run_while_locked(
        inductor_cache, lambda: merge_groups(inductor_cache, [group], {})
    )
    assert waited and finished
    assert read_record(inductor_cache) == {group.timed().pair()}  # type: ignore[union-attr]


def test_another_users_lock_file_is_still_a_lock(
    inductor_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a team's shared cache folder the lock file is the first user's: opening it to write
    was refused (EACCES), and every other user merged without a lock, warned each time. It is
    then opened to read, which a lock needs no more than."""
    import os

    from tunecache.inductor import served as served_record

    with served_record.locked(inductor_cache):
        pass  # the first user made it
    real_open = os.open

    def not_mine(path: Any, flags: int, *mode: int) -> int:
        if str(path).endswith(served_record.LOCK_SUFFIX) and flags & os.O_RDWR:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *mode)

    monkeypatch.setattr(served_record.os, "open", not_mine)

    def enter() -> None:
        with served_record.locked(inductor_cache):
            pass

    waited, finished = run_while_locked(inductor_cache, enter)
    assert waited and finished


def run_while_locked(choice_file: Path, second: Callable[[], object]) -> tuple[bool, bool]:
    """Runs ``second`` in a thread while another thread holds ``choice_file``'s lock for half a
    second: whether it waited that long, and whether it finished once the lock was free."""
    import threading

    from tunecache.inductor import served as served_record

    holding, release, done = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        with served_record.locked(choice_file):
            holding.set()
            release.wait(10)

    def run() -> None:
        second()
        done.set()

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(10)
    runner = threading.Thread(target=run)
    runner.start()
    waited = not done.wait(0.5)
    release.set()
    holder.join(10)
    runner.join(10)
    return waited, done.is_set()
