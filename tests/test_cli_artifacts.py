"""``tunecache artifacts ls`` on a real server: what the integrations shared, for this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx

from tests.conftest import LiveServer
from tests.factories import AUTH, issue_token
from tunecache.artifacts import ArtifactIn
from tunecache.client import Client
from tunecache.inductor.partition import partition

# A Triton best config as Inductor's AutotuneCache.save writes it (the namespace's schema).
BEST = {"XBLOCK": 128, "R0_BLOCK": 8, "num_warps": 4, "num_stages": 1,
        "configs_hash": "a" * 64, "found_by_coordesc": False, "time_taken_ms": 12,
        "triton_cache_hash": None}  # fmt: skip


def tunecache(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunecache_cli", *args], capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def group(op: str, choices: int) -> dict[str, object]:
    timings = {f"choice-{i}": 1.0 + i for i in range(choices)}
    return {"op": op, "inputs": "[[8, 8]]", "precision": "highest", "timings": timings}


def test_artifacts_ls_lists_this_machines_inductor_items(server: LiveServer) -> None:
    """An ``inductor.enable()`` or ``tune --torch`` upload was seen by no command: records ls
    lists records only. A bare ``artifacts ls`` lists this machine's Inductor partition."""
    own, other = partition(), "another-system|torch-2.0"
    with Client(server.url) as client:
        client.put_artifacts([
            ArtifactIn(namespace="inductor.choices", partition=own, key="mm-key", item="x",
                       value=group("mm", 3), score=1.0),
            ArtifactIn(namespace="inductor.autotune", partition=own, key="k" * 60, value=BEST),
            ArtifactIn(namespace="inductor.choices", partition=other, key="elsewhere",
                       value=group("addmm", 1), score=2.0),
        ])  # fmt: skip
    done = tunecache("artifacts", "ls", "--server", server.url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"partition {own}"
    assert "inductor.choices: 1 item" in lines and "inductor.autotune: 1 item" in lines
    assert "mm highest, 3 choices timed" in done.stdout and "elsewhere" not in done.stdout
    assert "score ms" in lines[2]
    # a best config reads as its arguments, without Inductor's bookkeeping; a long key is cut
    assert "XBLOCK=128 R0_BLOCK=8 num_warps=4 num_stages=1" in done.stdout
    assert "configs_hash" not in done.stdout and "k" * 24 + "..." + "k" * 13 in done.stdout
    # another partition, one namespace, as JSON
    listed = tunecache("artifacts", "ls", "--partition", other, "--namespace", "inductor.choices",
                       "--json", "--server", server.url)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    (item,) = json.loads(listed.stdout)["items"]
    assert (item["key"], item["value"]["op"], item["score"]) == ("elsewhere", "addmm", 2.0)
    # a partition's items by key, each key's best score first (they came by id)
    with Client(server.url) as client:
        client.put_artifacts([
            ArtifactIn(namespace="inductor.choices", partition="ranked", key=key,
                       item=str(score), value=group("mm", 1), score=score)
            for key, score in [("b", 3.0), ("a", 2.0), ("b", 1.0), ("a", None), ("a", 0.5)]
        ])  # fmt: skip
    ranked = tunecache("artifacts", "ls", "--partition", "ranked", "--json", "--server",
                       server.url)  # fmt: skip
    order = [(a["key"], a["score"]) for a in json.loads(ranked.stdout)["items"]]
    assert order == [("a", 0.5), ("a", 2.0), ("a", None), ("b", 1.0), ("b", 3.0)], order
    # more than shown is said only when there are more
    for limit, said in (
        ("5", "inductor.choices: 5 items\n"),
        ("4", "4 items (more not listed; raise --limit)"),
    ):
        cut = tunecache("artifacts", "ls", "--partition", "ranked", "--limit", limit, "--server",
                        server.url)  # fmt: skip
        assert said in cut.stdout, cut.stdout
    # nothing there: exit 1, said
    empty = tunecache("artifacts", "ls", "--partition", "nothing-here", "--server", server.url)
    assert empty.returncode == 1 and "inductor.choices: 0 items" in empty.stdout


def test_every_namespaces_score_is_listed_in_milliseconds(server: LiveServer) -> None:
    """A TVM record's score is its mean run time in seconds: listed as it was, ``8.41e-06`` sat
    in one column with Inductor's milliseconds (``12``)."""
    from tests.test_tvm_allowlist import CPU_TRACE

    value = [CPU_TRACE, [8.41e-06], None, [["TENSOR", "float32", [8]]]]
    with Client(server.url) as client:
        client.put_artifacts([ArtifactIn(namespace="tvm.record", partition="llvm -x", key="k",
                                         value=value, score=8.41e-06)])  # fmt: skip
    done = tunecache("artifacts", "ls", "--partition", "llvm -x", "--namespace", "tvm.record",
                     "--server", server.url)  # fmt: skip
    assert done.returncode == 0, done.stderr
    header, _, row = done.stdout.splitlines()[2:5]
    assert "score ms" in header and " 0.00841 " in row, done.stdout
    # A partition named alone lists every kind it holds: a TVM partition's records were
    # "inductor.choices: 0 items / inductor.autotune: 0 items", exit 1 (a newcomer's walk)
    every = tunecache("artifacts", "ls", "--partition", "llvm -x", "--server", server.url)
    assert every.returncode == 0, every.stderr
    assert "tvm.record: 1 item" in every.stdout and "inductor" not in every.stdout, every.stdout


def test_artifacts_ls_bad_input_exits_2_naming_it() -> None:
    for args, said in [
        (["--namespace", "tvm.record"], "--namespace tvm.record needs --partition"),
        (["--limit", "0"], "--limit must be 1 to 1000, not 0"),
        (["--partition", " "], "--partition ' ': expected 1 to 256 characters"),
        (["--namespace", "tvm.records"], "invalid choice: 'tvm.records'"),
    ]:
        done = tunecache("artifacts", "ls", *args, "--server", "http://127.0.0.1:9")
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr


def test_revoking_a_token_says_its_shared_artifacts_are_served_no_more(server: LiveServer) -> None:
    """A teammate's tune --tvm / tune --torch work went out of service with its token, the
    revocation saying only 'revoked token 2'."""
    writer = issue_token(server.url, "write")
    with Client(server.url, token=writer) as client:
        client.put_artifacts(
            [
                ArtifactIn(
                    namespace="inductor.choices",
                    partition="p",
                    key=f"k{i}",
                    value=group("mm", 1),
                    score=1.0,
                )
                for i in range(3)
            ]
        )
    tokens = httpx.get(f"{server.url}/v1/tokens", headers=AUTH, timeout=30).json()["items"]
    (writer_id,) = [t["id"] for t in tokens if t["scope"] == "write"]
    env = {**os.environ, "TUNECACHE_TOKEN": AUTH["Authorization"].removeprefix("Bearer ")}
    done = subprocess.run([sys.executable, "-m", "tunecache_cli", "token", "revoke",
                           str(writer_id), "--server", server.url], capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "its 3 shared artifacts (Inductor's choices" in done.stderr, done.stderr
    with Client(server.url) as client:
        assert client.get_artifacts("inductor.choices", "p") == []  # as said
