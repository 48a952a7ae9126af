"""The ranks of a ``torch.distributed`` job read the team's TVM records and Inductor choice
groups once for all of them (``tunecache.ranks``), so a server answering each read differently (a
record uploaded between two ranks' reads, a shed read, a hostile server) cannot give ranks
different schedules or choices. Two gloo ranks on the CPU, each in its own process
(``tests/user_ranks_tvm_inductor.py``), against a server of the test's own that answers each read
with the next of its scripted answers."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from cache_server.embedded import free_port
from tests.rank_procs import answers as ranks_printed
from tunecache.http import IDENTITY_HEADER

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
Answer = Callable[[dict[str, str]], tuple[int, list[dict[str, Any]]]]  # query → status, items


class Scripted:
    """A server answering the n-th read of artifacts with ``answers[n]`` (the last one from
    then on), counting the reads."""

    def __init__(self, answers: list[Answer]) -> None:
        self.answers = answers
        self.reads = 0
        self.lock = threading.Lock()

    def next(self, query: dict[str, str]) -> tuple[int, list[dict[str, Any]]]:
        with self.lock:
            answer = self.answers[min(self.reads, len(self.answers) - 1)]
            self.reads += 1
        return answer(query)


@pytest.fixture
def scripted() -> Iterator[Callable[[list[Answer]], tuple[str, Scripted]]]:
    servers: list[ThreadingHTTPServer] = []

    def start(answers: list[Answer]) -> tuple[str, Scripted]:
        script = Scripted(answers)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                status, items = script.next(query) if url.path == "/v1/artifacts" else (404, [])
                body = json.dumps({"items": items, "next_after": None} if status == 200 else
                                  {"status": status, "detail": "busy", "errors": []}).encode()  # fmt: skip
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header(IDENTITY_HEADER, "tunecache/0")
                if status == 503:
                    self.send_header("Retry-After", "60")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}", script

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def items(namespace: str, values: Sequence[tuple[str | None, Any, float]]) -> Answer:
    """An answer of ``values`` (key, value, score): the key ``None`` is the one asked for."""

    def answer(query: dict[str, str]) -> tuple[int, list[dict[str, Any]]]:
        now = datetime.datetime.now(datetime.UTC).isoformat()
        return 200, [{"namespace": namespace, "partition": query["partition"],
                      "key": key or query["key"], "item": f"i{n}", "value": value,
                      "score": score, "id": n + 1, "updated_at": now}
                     for n, (key, value, score) in enumerate(values)]  # fmt: skip

    return answer


def shed(query: dict[str, str]) -> tuple[int, list[dict[str, Any]]]:
    return 503, []


def run_ranks(world: int, url: str, what: str, steps: list[str],
              tmp: Path) -> list[Any]:  # fmt: skip
    """Runs ``steps`` on each of ``world`` ranks (1: no distributed job); what each ended with."""
    init = f"tcp://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNECACHE_")}
    script = "import tests.user_ranks_tvm_inductor as m; m.main()"
    ranks = [
        subprocess.Popen([sys.executable, "-c", script, str(rank), str(world), init, url, what,
                          json.dumps(steps), str(tmp / f"inductor-{rank}")], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in range(world)
    ]  # fmt: skip
    return ranks_printed(ranks, timeout=180)


# -- TVM ------------------------------------------------------------------------------------------


def tvm_sets() -> tuple[Answer, Answer]:
    """Record set A (split by 2, 1 µs) and set B (split by 4, 2 µs) of the ranks' workload."""
    pytest.importorskip("tvm")
    from tests.user_ranks_tvm_inductor import record_value, row_sum

    mod = row_sum(16)
    a = items("tvm.record", [(None, record_value(mod, 2, 1e-6), 1e-6)])
    b = items("tvm.record", [(None, record_value(mod, 4, 2e-6), 2e-6)])
    return a, b


def test_tvm_ranks_schedule_from_one_read_whatever_the_server_answers_each(
    scripted: Any, tmp_path: Path
) -> None:
    """The server answers its first read with set A, every later one with set B: read by each
    rank, one rank ended with A and the other with B. Both end with the one read's record; after
    ``refresh()`` both re-read together (a new agreement) and take B; two reads in all."""
    a, b = tvm_sets()
    url, server = scripted([a, b])
    ranks = run_ranks(2, url, "tvm", ["top", "top", "refresh", "top"], tmp_path)
    assert ranks[0] == ranks[1], ranks
    first, again, refreshed = ranks[0]
    assert first == again and first[0] == pytest.approx(1e-6)  # set A, read once
    assert refreshed[0] == pytest.approx(2e-6)  # set B, read once more
    assert server.reads == 2


def test_tvm_ranks_agree_on_a_shed_read_then_on_the_next_attempt(
    scripted: Any, tmp_path: Path
) -> None:
    """The first read is shed (503, Retry-After 60 s: past the read's timeout, so not asked again within it), later ones answer set A. The ranks agree
    that the first attempt had no answer (no record), and on the next: read by each rank, the
    shed rank kept no record while the other scheduled from A."""
    a, _ = tvm_sets()
    url, server = scripted([shed, a])
    ranks = run_ranks(2, url, "tvm", ["top", "top"], tmp_path)
    assert ranks[0] == ranks[1], ranks
    assert ranks[0][0] is None
    assert server.reads <= 2


def test_tvm_outside_a_distributed_job_each_lookup_reads_the_server_itself(
    scripted: Any, tmp_path: Path
) -> None:
    """No process group: the database reads the server itself, once per workload and again
    after ``refresh()``, as before ranks shared reads."""
    a, b = tvm_sets()
    url, server = scripted([a, b])
    (alone,) = run_ranks(1, url, "tvm", ["top", "refresh", "top"], tmp_path)
    assert [found[0] for found in alone] == [pytest.approx(1e-6), pytest.approx(2e-6)]
    assert server.reads == 2


# -- Inductor -------------------------------------------------------------------------------------

GROUP = {"op": "mm", "inputs": "[('cpu', 'torch.float32', 8, 8)]", "precision": "highest",
         "timings": {"a-1": 0.5, "b-2": 0.25}}  # fmt: skip


def group(inputs: str) -> tuple[str, dict[str, Any], float]:
    value = {**GROUP, "inputs": inputs}
    return f"mm|highest|{inputs}", value, 0.25


def test_inductor_ranks_merge_the_groups_of_one_read(scripted: Any, tmp_path: Path) -> None:
    """The server answers its first read with one group, every later one with two others: read
    by each rank, the ranks merged different groups (and max-autotune would pick different
    kernels). Each ``enable()`` is one read for both ranks, and both merge its groups (and take
    out the one merged before that the server no longer serves)."""
    pytest.importorskip("torch")
    first = [group("[('cpu', 'torch.float32', 8, 8)]")]
    later = [group("[('cpu', 'torch.float32', 16, 16)]"), group("[('cpu', 'torch.float32', 4, 4)]")]
    url, server = scripted([items("inductor.choices", first), items("inductor.choices", later)])
    ranks = run_ranks(2, url, "inductor", ["enable", "enable"], tmp_path)
    assert ranks[0] == ranks[1], ranks
    once, twice = ranks[0]
    assert once == {"fetched": 1, "groups": [first[0][0]]}
    assert twice["fetched"] == 2 and sorted(twice["groups"]) == sorted(g[0] for g in later)
    assert server.reads == 2


def test_inductor_outside_a_distributed_job_enable_reads_the_server_itself(
    scripted: Any, tmp_path: Path
) -> None:
    """No process group: each ``enable()`` reads the server itself."""
    pytest.importorskip("torch")
    url, server = scripted([items("inductor.choices", [group("[('cpu', 'torch.float32', 2, 2)]")])])
    (alone,) = run_ranks(1, url, "inductor", ["enable", "enable"], tmp_path)
    assert [step["fetched"] for step in alone] == [1, 1]
    assert server.reads == 2


# -- what a peer publishes ------------------------------------------------------------------------


class Store:
    """A process group's store as the reading rank left it: ``value`` published under every
    name, every name claimed already."""

    def __init__(self, value: str) -> None:
        self.value = value
        self.timeout = datetime.timedelta(seconds=1)

    def add(self, name: str, n: int) -> int:
        return 2

    def wait(self, names: list[str], timeout: datetime.timedelta) -> None:
        pass

    def get(self, name: str) -> bytes:
        return self.value.encode()


def follow(published: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[str]]:
    """What a following rank takes of ``published`` for a partition's ``tvm.record`` items of
    key ``k``, and the reads it made itself."""
    import tunecache.ranks as ranks

    monkeypatch.setattr(ranks, "_default_store", lambda: Store(published))
    reads: list[str] = []

    def read() -> list[Any]:
        reads.append("read")
        return []

    return ranks.shared_artifacts(read, "tvm.record", "p", "k"), reads


def peer_item(**changes: Any) -> dict[str, Any]:
    return {"namespace": "tvm.record", "partition": "p", "key": "k", "item": "x", "value": [1],
            "score": 1.0, "id": 1, "updated_at": "2025-01-01T00:00:00Z", **changes}  # fmt: skip


def test_a_peers_items_are_taken_as_a_servers_are(monkeypatch: pytest.MonkeyPatch) -> None:
    """Published items pass the client's models; another partition's or key's are left out, as
    the client leaves out a server's; "no answer" is taken as no answer."""
    from tunecache.ranks import READ

    mixed = [peer_item(), peer_item(partition="q"), peer_item(key="other")]
    taken, reads = follow(READ + json.dumps(mixed), monkeypatch)
    assert [(item.partition, item.key) for item in taken] == [("p", "k")] and reads == []
    assert follow(READ + "null", monkeypatch) == (None, [])


@pytest.mark.parametrize("published", [
    "failed", "read:{", "read:" + json.dumps([peer_item(value=json.loads("[" * 40 + "]" * 40))]), 'read:[{"id": 1}]',
    "read:[" + "{}," * 5_000_000 + "{}]",  # past the containers a read holds
    "read:" + json.dumps([peer_item(score=float("nan"))]),
], ids=["failed", "not-json", "deep", "not-an-artifact", "too-big", "nan"])  # fmt: skip
def test_a_peers_refused_answer_makes_the_rank_read_alone(
    published: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A reading rank that failed, or published what a server's answer may not hold: the rank
    reads the server itself, warned, and takes nothing of it."""
    import tunecache.ranks as ranks

    monkeypatch.setattr(ranks, "_warned", set())
    with caplog.at_level("WARNING", logger="tunecache.ranks"):
        taken, reads = follow(published, monkeypatch)
    assert taken == [] and reads == ["read"]
    assert "reads the server alone" in caplog.text


def test_inductors_best_config_of_a_kernel_is_a_peers_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor's best Triton config of a kernel is read lazily, per kernel: a following rank
    takes the one its peer read and never asks the server (ranks reading on their own launched
    different configs where one was uploaded between their reads)."""
    from tunecache.inductor.autotune import NAMESPACE, AutotuneStore
    from tunecache.ranks import READ

    best = {"XBLOCK": 128, "R0_BLOCK": 8, "num_warps": 4, "num_stages": 1, "configs_hash": "c0",
            "found_by_coordesc": False, "time_taken_ms": 12, "triton_cache_hash": None}  # fmt: skip
    published = [peer_item(namespace=NAMESPACE, key="kernel-key", value=best)]
    import tunecache.ranks as ranks

    monkeypatch.setattr(ranks, "_default_store", lambda: Store(READ + json.dumps(published)))

    class Team:
        partition = "p"

        def fetch(self, namespace: str, key: str | None = None) -> list[Any]:
            raise AssertionError("a following rank asked the server")

    data = AutotuneStore(Team()).get("kernel-key")  # type: ignore[arg-type]
    assert data is not None and json.loads(data)["XBLOCK"] == 128
