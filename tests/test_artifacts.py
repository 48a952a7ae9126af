"""The artifact store on a real server, SQLite and PostgreSQL: upsert by score, pages, refusals."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import LiveServer
from tests.factories import AUTH, issue_token
from tunecache.artifacts import MAX_BATCH, MAX_VALUE_BYTES, ArtifactIn
from tunecache.client import Client
from tunecache.errors import ServerError

PART = "sys-abc|torch-2.13.0"
NS = "inductor.choices"


def group(tag: object) -> dict[str, object]:
    """An Inductor choice group (a value the namespace's closed schema admits) named ``tag``."""
    return {"op": "mm", "inputs": f"[{tag}]", "precision": "highest", "timings": {"c-1": 1.0}}


def tag(value: object) -> str:
    assert isinstance(value, dict)
    return str(value["inputs"]).strip("[]")


def item(key: str, name: object, *, score: float | None = None, sub: str = "") -> ArtifactIn:
    return ArtifactIn(namespace=NS, partition=PART, key=key, item=sub, value=group(name),
                      score=score)  # fmt: skip


def test_items_round_trip_and_a_key_reads_best_score_first(any_server: LiveServer) -> None:
    with Client(any_server.url) as client:
        result = client.put_artifacts(
            [item("w1", "t3", score=3.0, sub="a"), item("w1", "t1", score=1.0, sub="b"),
             item("w1", "unscored", sub="c"), item("w2", "t2", score=2.0, sub="a")]
        )  # fmt: skip
        assert (result.stored, result.kept) == (4, 0)
        got = client.get_artifacts(NS, PART, key="w1")
        assert [(a.item, tag(a.value)) for a in got] == [("b", "t1"), ("a", "t3"),
                                                         ("c", "unscored")]  # fmt: skip
        assert got[0].updated_at.tzinfo is not None
        assert len(client.get_artifacts(NS, PART)) == 4
        assert client.get_artifacts(NS, "another|partition") == []
        assert client.get_artifacts("inductor.autotune", PART) == []


def test_a_scored_item_is_replaced_only_by_a_better_score(any_server: LiveServer) -> None:
    with Client(any_server.url) as client:
        client.put_artifacts([item("w", "first", score=2.0)])
        worse = client.put_artifacts([item("w", "worse", score=5.0)])
        assert (worse.stored, worse.kept) == (0, 1)
        assert tag(client.get_artifacts(NS, PART, key="w")[0].value) == "first"
        better = client.put_artifacts([item("w", "better", score=0.5)])
        assert (better.stored, better.kept) == (1, 0)
        assert tag(client.get_artifacts(NS, PART, key="w")[0].value) == "better"
        client.put_artifacts([item("u", 1), item("u", 2)])  # unscored: the last one wins
        assert tag(client.get_artifacts(NS, PART, key="u")[0].value) == "2"


def test_an_unscored_item_never_replaces_a_scored_one(any_server: LiveServer) -> None:
    """Another token's ``score: null`` replaced a scored item (the best one served), against
    "each replaced only by a better-scored one"; a scored item still replaces an unscored one."""
    other = issue_token(any_server.url, "write")
    with Client(any_server.url) as client, Client(any_server.url, token=other) as them:
        client.put_artifacts([item("s", "good", score=0.5)])
        assert them.put_artifacts([item("s", "unscored")]).stored == 1  # their own copy
        served = client.get_artifacts(NS, PART, key="s")
        assert [(tag(a.value), a.score) for a in served] == [("good", 0.5)]
        assert client.put_artifacts([item("s", "unscored")]).kept == 1  # not over its own
        client.put_artifacts([item("n", "unscored")])
        assert them.put_artifacts([item("n", "scored", score=9.0)]).stored == 1
        assert tag(client.get_artifacts(NS, PART, key="n")[0].value) == "scored"


def test_another_tokens_made_up_score_keeps_the_teammates_item_and_revoking_it_restores_it(
    any_server: LiveServer,
) -> None:
    """An item was one row: another token's made-up score (0) replaced a teammate's honest item
    in place, which was lost, and revoking that token left the made-up one in service. Each token
    now keeps its own copy; a read serves the best live one, each item once."""
    hostile = issue_token(any_server.url, "write")
    with Client(any_server.url) as team, Client(any_server.url, token=hostile) as them:
        team.put_artifacts([item("k", "honest", score=0.5), item("k", "other", score=2.0,
                                                                   sub="b")])  # fmt: skip
        assert them.put_artifacts([item("k", "made-up", score=0.0)]).stored == 1
        served = team.get_artifacts(NS, PART, key="k")
        assert [(a.item, tag(a.value)) for a in served] == [("", "made-up"), ("b", "other")]
        assert sorted(tag(a.value) for a in team.get_artifacts(NS, PART)) == ["made-up", "other"]
        (hostile_id,) = [t.id for t in team.list_tokens() if t.name == "test-write"]
        team.revoke_token(hostile_id)
        served = team.get_artifacts(NS, PART, key="k")
        assert [(tag(a.value), a.score) for a in served] == [("honest", 0.5), ("other", 2.0)]
        assert sorted(tag(a.value) for a in team.get_artifacts(NS, PART)) == ["honest", "other"]


def test_a_partition_read_serves_each_item_once_across_pages(server: LiveServer) -> None:
    """Copies of one item from several tokens, the best stored first or last: paging by id
    serves each item exactly once, from its best copy, whichever page that copy falls on."""
    tokens = [issue_token(server.url, "write") for _ in range(3)]
    for n, token in enumerate(tokens):
        with Client(server.url, token=token) as client:  # token n is best at item n % 3
            client.put_artifacts([item(f"k{i}", f"{i}-{n}", score=float((i - n) % 3))
                                  for i in range(12)])  # fmt: skip
    for limit in (1, 5, 1000):
        got, after = [], None
        while True:
            params = {"namespace": NS, "partition": PART, "limit": limit}
            page = httpx.get(
                f"{server.url}/v1/artifacts",
                headers=AUTH,
                params={**params, **({} if after is None else {"after": after})},
            )
            got += [tag(a["value"]) for a in page.json()["items"]]
            if (after := page.json()["next_after"]) is None:
                break
        assert sorted(got) == sorted(f"{i}-{i % 3}" for i in range(12)), limit


def test_concurrent_writers_leave_the_best_score(server: LiveServer) -> None:
    scores = [float(s) for s in range(40, 0, -1)]

    def put(score: float) -> None:
        with Client(server.url) as client:
            client.put_artifacts([item("race", score, score=score)])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, scores))
    with Client(server.url) as client:
        (stored,) = client.get_artifacts(NS, PART, key="race")
    assert tag(stored.value) == "1.0" and stored.score == 1.0


def test_a_partition_larger_than_a_page_is_read_whole(server: LiveServer) -> None:
    many = [item(f"k{i}", i) for i in range(MAX_BATCH + 700)]
    with Client(server.url) as client:
        assert client.put_artifacts(many).stored == len(many)  # two batches
        got = client.get_artifacts(NS, PART)  # two pages
        assert sorted(int(tag(a.value)) for a in got) == list(range(len(many)))
        assert len(client.get_artifacts(NS, PART, limit=1100)) == 1100


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"items": [{"namespace": "fx.graph", "partition": "p", "key": "k", "value": {}}]},
         "namespace"),
        ({"items": [{"namespace": "tvm.record", "partition": "p", "key": "k", "value": "str"}]},
         "value"),
        ({"items": [{"namespace": "tvm.record", "partition": "p", "key": "k", "value": {},
                     "score": -1}]}, "score"),
        ({"items": [{"namespace": "tvm.record", "partition": "", "key": "k", "value": {}}]},
         "partition"),
        ({"items": [{"namespace": "tvm.record", "partition": "p", "key": "k\n", "value": {}}]},
         "key"),
        ({"items": [{"namespace": "tvm.record", "partition": "p", "key": "k",
                     "value": {"x": "y" * MAX_VALUE_BYTES}}]}, "bytes"),
        ({"items": []}, "items"),
        ({"items": [{"namespace": "tvm.record", "partition": "x" * 257, "key": "k", "value": {}}]},
         "partition: at most 256 characters, not 257"),  # not "256 items after validation"
    ],
)  # fmt: skip
def test_malformed_items_are_refused_with_a_reason(
    shared_server: LiveServer, body: dict[str, object], says: str
) -> None:
    response = httpx.post(f"{shared_server.url}/v1/artifacts", json=body, headers=AUTH)
    assert response.status_code == 422
    assert says in response.text


def test_a_nan_score_and_an_unknown_read_are_refused(shared_server: LiveServer) -> None:
    nan = ('{"items": [{"namespace": "tvm.record", "partition": "p", "key": "k", "value": {},'
           ' "score": NaN}]}')  # fmt: skip
    response = httpx.post(f"{shared_server.url}/v1/artifacts", content=nan,
                          headers={**AUTH, "Content-Type": "application/json"})  # fmt: skip
    assert response.status_code == 422
    bad_read = httpx.get(f"{shared_server.url}/v1/artifacts", headers=AUTH,
                         params={"namespace": "tvm.record", "partition": "p", "key": "k",
                                 "after": 3})  # fmt: skip
    assert bad_read.status_code == 422 and "after" in bad_read.text


def test_writes_need_a_write_token(shared_server: LiveServer) -> None:
    with Client(shared_server.url) as admin:
        reader = admin.create_token("artifact-reader", "read").token
    with Client(shared_server.url, token=reader) as client:
        assert client.get_artifacts("inductor.choices", PART) == []
        with pytest.raises(ServerError) as refused:
            client.put_artifacts([item("k", {})])
        assert refused.value.status_code == 403
    with Client(shared_server.url, token="") as anonymous, pytest.raises(ServerError) as missing:
        anonymous.put_artifacts([item("k", {})])
    assert missing.value.status_code == 401
