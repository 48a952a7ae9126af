"""A client made before a fork: the children and the parent each use their own connections.

A parent that looked a key up (a keep-alive connection left in its pool) and then forked
DataLoader-style workers had them all write requests onto that one inherited socket: answers
crossed, every process got the default config, warned of a server that was "not a tunecache
server" or broke the protocol, and skipped the server for 30 s.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cache_server.embedded import free_port
from tests.conftest import LiveServer, start_server
from tests.factories import knobs, make_key, make_record
from tunecache import Client, SnapshotSource
from tunecache.key import Key
from tunecache.snapshot import SnapshotFilters, render_snapshot, save_snapshot
from tunecache.triton import shared_client as shared

WORKERS = 4
KEYS = 12  # looked up by every process at once, each a request to the server
FORK = multiprocessing.get_context("fork")


@pytest.fixture
def patient_server(tmp_path: Path) -> Iterator[LiveServer]:
    """A server that lets five processes' lookups wait their turn (not shed after 20 ms): what
    this file tests is the client, on a two-core machine."""
    live = start_server(f"sqlite:///{tmp_path / 'cache.db'}", tmp_path / "cache.db",
                        tmp_path / "server.log", env={"TUNECACHE_SERVER_MAX_WAIT": "10"})  # fmt: skip
    yield live
    live.stop()


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def look_up(client: Client, keys: list[Key]) -> tuple[list[str], list[str]]:
    """The source of each key's answer, and the warnings logged meanwhile."""
    caught = Warnings()
    logging.getLogger("tunecache").addHandler(caught)
    try:
        sources: list[str] = [client.lookup(key, default={"tile": 0}).source for key in keys]
    finally:
        logging.getLogger("tunecache").removeHandler(caught)
    return sources, caught.lines


def worker(get: Callable[[], Client], keys: list[Key], go: object, out: object) -> None:
    go.wait(30)  # type: ignore[attr-defined]
    out.put(look_up(get(), keys))  # type: ignore[attr-defined]


def run_forked(get: Callable[[], Client], server: LiveServer) -> dict[str, object]:
    """What the parent, its forked workers, and the parent afterwards each got (the sources of
    their answers and their warnings), and the workers' exit codes."""
    keys = [make_key(m=64 * (i + 1)) for i in range(KEYS + 1)]
    with Client(server.url) as uploader:
        for key in keys:
            uploader.upload(make_record(key, time_ms=0.5))
    parent = get()
    assert look_up(parent, keys[:1]) == (["server"], [])  # a connection stays in the pool
    go, out = FORK.Event(), FORK.Queue()
    children = [FORK.Process(target=worker, args=(get, keys[1:], go, out))
                for _ in range(WORKERS)]  # fmt: skip
    for child in children:
        child.start()
    go.set()
    mine = look_up(parent, keys[1:])
    theirs = [out.get(timeout=60) for _ in children]
    for child in children:
        child.join(30)
    after = look_up(parent, [keys[0], make_key(m=4096)])
    return {"parent": mine, "workers": theirs, "exits": [c.exitcode for c in children],
            "after": after}  # fmt: skip


SERVED_EVERYWHERE = {
    "parent": (["server"] * KEYS, []),
    "workers": [(["server"] * KEYS, [])] * WORKERS,
    "exits": [0] * WORKERS,
    "after": (["memo", "default"], []),  # the parent's client still works after its children
}


def test_forked_workers_and_their_parent_each_get_the_served_configs(
    patient_server: LiveServer,
) -> None:
    client = Client(patient_server.url, timeout=10)
    try:
        assert run_forked(lambda: client, patient_server) == SERVED_EVERYWHERE
    finally:
        client.close()


def test_the_triton_drop_ins_one_client_a_process_is_fork_safe_too(
    patient_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNECACHE_URL", patient_server.url)
    monkeypatch.setenv("TUNECACHE_TIMEOUT", "10")
    shared._read.cache_clear()
    shared._shared_client.cache_clear()
    try:
        found = run_forked(lambda: shared.shared_client(None, None, "strict"), patient_server)
        assert found == SERVED_EVERYWHERE
    finally:
        shared.shared_client(None, None, "strict").close()
        shared._read.cache_clear()
        shared._shared_client.cache_clear()


def test_a_child_forked_while_a_parent_thread_loads_the_snapshot_answers_from_it(
    tmp_path: Path,
) -> None:
    """The snapshot source's lock, held by a parent thread loading the file at the fork, was
    held for good in the child: its first lookup blocked for ever."""
    key = make_key()
    body, _ = render_snapshot(SnapshotFilters(device_arch=make_key().device.arch),
                              [make_record(key, config=knobs(5))])  # fmt: skip
    path = tmp_path / "winners.json"
    save_snapshot(path, json.loads(body))
    client = Client(f"http://127.0.0.1:{free_port()}", timeout=0.2, snapshot=path)
    (snapshot,) = [s for s in client.resolver.sources if isinstance(s, SnapshotSource)]
    try:
        with snapshot._lock:  # as a parent thread loading it holds it
            child = FORK.Process(target=_snapshot_answer, args=(client, key))
            child.start()
        child.join(30)
        if child.is_alive():
            child.kill()
        assert child.exitcode == 0
    finally:
        client.close()


def _snapshot_answer(client: Client, key: Key) -> None:
    answer = client.lookup(key, default={"tile": 0})
    raise SystemExit(0 if (answer.source, answer.config) == ("snapshot", knobs(5)) else 3)


def test_a_child_does_not_use_a_config_its_parent_found_wrong() -> None:
    """The renewed resolver forgot the parent's failed checks: a child was served the record
    its parent had just proved wrong (its dispute perhaps still queued)."""
    from tunecache import forksafe

    client = Client(f"http://127.0.0.1:{free_port()}", timeout=0.2)
    try:
        client.resolver._failed.add(("digest", "{}"))
        client.resolver._failed_keys.add("digest")
        client.resolver._verified.add(("other", "{}"))
        child = forksafe.renewed(client.resolver, client.server, client.server)
        assert ("digest", "{}") in child._failed and "digest" in child._failed_keys
        assert ("other", "{}") in child._verified
    finally:
        client.close()


def silent_child_lookup(client: Client, key: Key, out: object) -> None:
    out.put(look_up(client, [key]))  # type: ignore[attr-defined]


def test_a_child_knows_the_server_its_parent_found_silent_is_down() -> None:
    """A server that accepts and never answers: the parent waited its lookup timeout and
    warned. Each forked worker asked again (another connection, another timeout) and warned
    again; now a child skips it as its parent does, with the default and no second warning."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    client = Client(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=0.5)
    try:
        sources, warned = look_up(client, [make_key(m=64)])
        assert sources == ["default"] and len(warned) == 1 and "retrying in" in warned[0]
        before = len(accepted)
        out = FORK.Queue()
        child = FORK.Process(target=silent_child_lookup, args=(client, make_key(m=128), out))
        child.start()
        got = out.get(timeout=30)
        child.join(30)
        assert child.exitcode == 0
        assert got == (["default"], [])  # no second warning
        assert len(accepted) == before  # the child did not ask the server
    finally:
        client.close()
        listener.close()
        for conn in accepted:
            conn.close()


def client_made_in_child() -> None:
    shared.shared_client(f"http://127.0.0.1:{free_port()}", None, "strict")


def said_once_in_child() -> None:
    from tunecache.triton import outage

    outage.say_once("a cause", "a message")


def named_in_child() -> None:
    from tunecache import ranks

    ranks.next_name("a namespace", "a part")


@pytest.mark.parametrize(("module", "name", "in_child"),
                         [("tunecache.triton.shared_client", "_CREATING", client_made_in_child),
                          ("tunecache.triton.outage", "_lock", said_once_in_child),
                          ("tunecache.ranks", "_lock", named_in_child)])  # fmt: skip
def test_a_child_forked_while_a_parent_thread_holds_a_modules_lock_goes_on(
    module: str, name: str, in_child: Callable[[], None]
) -> None:
    """A module-level lock a parent thread held at the fork (the drop-in's client being made, a
    warning said once, a rank's read named) was held in the child for good: its first lookup,
    warning or read waited for ever."""
    import importlib

    lock = getattr(importlib.import_module(module), name)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10)
        child = FORK.Process(target=in_child)
        child.start()
        child.join(20)
        finished = child.exitcode
        if finished is None:
            child.kill()
    finally:
        release.set()
        holder.join(10)
    assert finished == 0
