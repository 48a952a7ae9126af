"""A finished tune is never lost: its record waits in the outbox until the server has it, and
``tunecache push`` (or the next tune) sends it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import start_server
from tests.factories import make_key, make_record
from tunecache.client import Client
from tunecache.errors import ServerError
from tunecache_cli import outbox

URL = "http://cache.example:8765"


class Upstream:
    """The client's upload, at the boundary we own: answers as told."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.sent: list[Any] = []

    def upload(self, record: Any) -> None:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        self.sent.append(record)


def waiting_for(url: str, folder: Path) -> int:
    return outbox.waiting(url, folder)


def test_sent_records_leave_refused_ones_move_aside_unreachable_ones_stay(tmp_path: Path) -> None:
    records = [make_record(make_key(m)) for m in (8, 16, 24, 32)]
    for record in records:
        outbox.release(outbox.put(URL, record, tmp_path))  # as a tune whose upload failed
    outbox.release(outbox.put("http://another:1", records[0], tmp_path))  # not sent to URL
    assert waiting_for(URL, tmp_path) == 4
    upstream = Upstream(None, ServerError("422 invalid", status_code=422),
                        ServerError("413 from a proxy", status_code=413, foreign=True),
                        ServerError("unreachable"))  # fmt: skip
    sent, refused, error = outbox.push(upstream, URL, tmp_path)
    assert (sent, refused) == (1, 1) and error is not None and error.status_code is None
    assert upstream.sent == [records[0]]
    assert waiting_for(URL, tmp_path) == 2  # not ours to refuse (a proxy's 413), unreachable
    assert len(list((tmp_path / "rejected").glob("*.json"))) == 1
    assert waiting_for("http://another:1", tmp_path) == 1
    (tmp_path / "broken.json").write_text("{not json")
    assert waiting_for(URL, tmp_path) == 2  # a broken file is skipped, not fatal


def test_a_record_is_taken_once_and_a_dead_takers_file_waits_again(tmp_path: Path) -> None:
    taken = outbox.put(URL, make_record(make_key(8)), tmp_path)  # this tune's upload is next
    assert waiting_for(URL, tmp_path) == 0  # not pushable meanwhile: never sent twice
    assert outbox.take(URL, tmp_path) == []
    dead = taken.with_name(taken.name.replace(f"-{os.getpid()}-", "-999999999-", 1))
    taken.rename(dead)  # as if its tune had been killed mid-upload
    assert waiting_for(URL, tmp_path) == 1
    (first,) = outbox.take(URL, tmp_path)
    assert outbox.take(URL, tmp_path) == []  # taken: a second pusher finds nothing
    outbox.done(first.path)
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_a_tune_whose_upload_fails_is_pushed_later(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    server = start_server(f"sqlite:///{db}", db, tmp_path / "server.log")
    port = server.url.rsplit(":", 1)[1]
    argv = ["tune", "softmax", "--backend", "tvm", "--shape", "M=64,N=64", "--trials", "4",
            "--server", server.url]  # fmt: skip
    env = {**os.environ, "TUNECACHE_OUTBOX": str(tmp_path / "outbox")}
    tune = subprocess.Popen([sys.executable, "-m", "tunecache_cli", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert tune.stderr is not None
    for line in tune.stderr:  # the search has begun: the check before work is behind it
        if "searching" in line:
            break
    server.stop()  # the server goes away before the upload
    _, err = tune.communicate(timeout=600)
    assert tune.returncode == 3, err
    assert "the record waits in" in err and "tunecache push" in err
    assert len(list((tmp_path / "outbox").glob("*.json"))) == 1
    server = start_server(f"sqlite:///{db}", db, tmp_path / "server.log", port=int(port))
    try:
        pushed = subprocess.run([sys.executable, "-m", "tunecache_cli", "push", "--server",
                                 server.url], env=env, capture_output=True, text=True,
                                timeout=120)  # fmt: skip
        assert pushed.returncode == 0, pushed.stderr
        assert "pushed 1 of 1 records" in pushed.stderr
        assert list((tmp_path / "outbox").glob("*.json")) == []
        with Client(server.url) as client:
            (stored,) = client.list_records().items
        assert stored.key.kernel == "softmax" and stored.validation.passed
    finally:
        server.stop()
