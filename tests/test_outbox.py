"""A finished tune is never lost: what it uploads (a record, or artifacts) waits in the outbox
until the server has it, and ``tunecache push`` (or the next tune) sends it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tunecache_cli
from tests.conftest import LiveServer, start_server
from tests.factories import make_key, make_record
from tunecache import outbox
from tunecache.client import Client
from tunecache.errors import ServerError
from tunecache_cli.outbox import kept_upload

URL = "http://cache.example:8765"


class Upstream:
    """The client's upload, at the boundary we own: answers as told."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.sent: list[Any] = []

    def _answer(self, what: str, body: Any) -> None:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        self.sent.append(body if what == "record" else (what, body))

    def upload(self, record: Any) -> None:
        self._answer("record", record)

    def put_artifacts(self, items: Any) -> None:
        self._answer("artifacts", items)


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
    sent, refused, error, _ = outbox.push(upstream, URL, tmp_path)
    assert (sent, refused) == (1, 1) and error is not None and error.status_code is None
    assert upstream.sent == [records[0]]
    assert waiting_for(URL, tmp_path) == 2  # not ours to refuse (a proxy's 413), unreachable
    assert len(list((tmp_path / "rejected").glob("*.json"))) == 1
    assert waiting_for("http://another:1", tmp_path) == 1
    (tmp_path / "broken.json").write_text("{not json")
    assert waiting_for(URL, tmp_path) == 2  # a broken file is skipped, not fatal


def test_uploads_put_within_one_millisecond_are_sent_in_the_order_put(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Files were named by the millisecond and sent in name order: two put within one went in
    the order of their digests (a fresh-clone CI run sent M=16 before M=8)."""
    import time as clock

    now = [1_700_000_000_000_000_000]

    def tick() -> int:  # a clock that moves 0.1 ms a read
        now[0] += 100_000
        return now[0]

    monkeypatch.setattr(clock, "time_ns", tick)
    monkeypatch.setattr(clock, "time", lambda: tick() / 1e9)
    records = [make_record(make_key(m)) for m in range(8, 168, 8)]
    for record in records:
        outbox.release(outbox.put(URL, record, tmp_path))
    upstream = Upstream(*[None] * len(records))
    assert outbox.push(upstream, URL, tmp_path)[:2] == (len(records), 0)
    assert upstream.sent == records


def test_artifacts_wait_beside_records_and_are_sent_as_artifacts(tmp_path: Path) -> None:
    from tests.test_artifacts import item

    items = [item("w1", "t1", score=1.0), item("w2", "t2")]
    outbox.release(outbox.put(URL, items, tmp_path))
    record = make_record(make_key(8))
    outbox.release(outbox.put(URL, record, tmp_path))
    (tmp_path / "bad.json").write_text(json.dumps({"url": URL, "artifacts": [{"namespace": "x"}]}))
    upstream = Upstream(None, None)
    assert outbox.push(upstream, URL, tmp_path)[:3] == (2, 1, None)  # bad.json: refused here
    assert ("artifacts", items) in upstream.sent  # as they were put: validated artifacts
    assert record in upstream.sent and len(upstream.sent) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["rejected"]  # nothing waits for ever
    assert [p.name for p in (tmp_path / "rejected").iterdir()] == ["bad.json"]


def test_a_failed_upload_says_where_it_waits(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("TUNECACHE_OUTBOX", str(tmp_path))
    record = make_record(make_key(8))
    with pytest.raises(ServerError, match=r"refused; the record waits in .*\.json \(tunecache "
                       f"push --server {URL} sends it\\)"):  # fmt: skip
        kept_upload(Upstream(ServerError("refused", status_code=503)), URL, record)
    assert waiting_for(URL, tmp_path) == 1
    assert kept_upload(Upstream(None), "http://other:1", record) is None  # sent: gone
    assert waiting_for("http://other:1", tmp_path) == 0
    refusal = ServerError("POST /v1/records → 422: invalid", status_code=422)
    with pytest.raises(ServerError, match=r"422: invalid; the record is kept in .*rejected"):
        kept_upload(Upstream(refusal), "http://other:1", record)  # never to be sent
    assert waiting_for("http://other:1", tmp_path) == 0
    assert len(list((tmp_path / "rejected").glob("*.json"))) == 1


def test_push_names_the_servers_other_uploads_wait_for(
    own_outbox: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outbox.release(outbox.put("http://gpu-box:8765", make_record(make_key(8)), own_outbox))
    outbox.release(outbox.put("http://gpu-box:8765", make_record(make_key(16)), own_outbox))
    assert tunecache_cli.main(["push", "--server", URL]) == 0  # nothing for it: no server asked
    err = capsys.readouterr().err
    assert f"nothing waits for {URL} in {own_outbox}" in err
    assert "2 uploads wait for http://gpu-box:8765: tunecache push --server http://gpu-box:8765" \
        in err  # fmt: skip


def test_an_upload_kept_for_a_url_with_a_password_waits_for_the_server_without_it(
    own_outbox: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Written before such URLs were refused: push never shows the password, and names the
    server as ``--server`` now must (``HTTP://`` is ``http://``), so the upload is not stranded."""
    outbox.release(outbox.put("HTTP://alice:hunter2@gpu-box:8765/", make_record(make_key(8)),
                              own_outbox))  # fmt: skip
    assert outbox.servers(own_outbox) == {"http://gpu-box:8765": 1}
    assert outbox.waiting("http://gpu-box:8765", own_outbox) == 1
    assert tunecache_cli.main(["push", "--server", URL]) == 0
    err = capsys.readouterr().err
    assert "hunter2" not in err and "alice" not in err
    assert "1 upload waits for http://gpu-box:8765: tunecache push --server http://gpu-box:8765" \
        in err  # fmt: skip


def test_a_record_is_taken_once_and_a_dead_takers_file_waits_again(tmp_path: Path) -> None:
    from tests.test_outbox_locks import kill, sender

    taken = outbox.put(URL, make_record(make_key(8)), tmp_path)  # this tune's upload is next
    assert waiting_for(URL, tmp_path) == 0  # not pushable meanwhile: never sent twice
    assert outbox.take(URL, tmp_path) == []
    outbox.done(taken)
    kill(sender(tmp_path))  # its tune killed mid-upload
    assert waiting_for(URL, tmp_path) == 1
    (first,) = outbox.take(URL, tmp_path)
    assert outbox.take(URL, tmp_path) == []  # taken: a second pusher finds nothing
    outbox.done(first.path)
    assert not any(tmp_path.iterdir())


def _stored(url: str, kind: str) -> int:
    """What the server holds of ``kind``: validated records, or Inductor choice groups."""
    with Client(url) as client:
        if kind == "record":
            return sum(r.validation.passed for r in client.list_records().items)
        from tunecache.inductor.partition import partition

        return len(client.get_artifacts("inductor.choices", partition()))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["record", "artifacts"])
def test_a_tune_whose_upload_fails_is_pushed_later(tmp_path: Path, kind: str) -> None:
    """The server goes away while a tune works (a key's search, or ``tune --torch``'s compile):
    exit 3 saying where the upload waits; ``tunecache push`` sends it once the server is back."""
    from tests.test_inductor_cache import write_model

    db = tmp_path / "cache.db"
    server = start_server(f"sqlite:///{db}", db, tmp_path / "server.log")
    port = server.url.rsplit(":", 1)[1]
    if kind == "record":
        argv = ["tune", "softmax", "--backend", "tvm", "--shape", "M=64,N=64", "--trials", "4"]
        working, what = "searching", "the record"
    else:
        argv = ["tune", "--torch", f"{write_model(tmp_path / 'model')}:Model", "--device", "cpu"]
        working, what = "compiling with max-autotune", "the upload"
    env = {**os.environ, "TUNECACHE_OUTBOX": str(tmp_path / "outbox"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # fmt: skip
    tune = subprocess.Popen([sys.executable, "-m", "tunecache_cli", *argv, "--server", server.url],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert tune.stderr is not None
    for line in tune.stderr:  # the work has begun: the check before work is behind it
        if working in line:
            break
    server.stop()  # the server goes away before the upload
    out, err = tune.communicate(timeout=600)
    assert tune.returncode == 3, err
    assert f"{what} waits in" in err and "tunecache push" in err
    # What the tune found is shown all the same (it was not: only where the upload waits).
    found = "stored     no (validated here)" if kind == "record" else "checked against"
    assert found in out, out
    assert len(list((tmp_path / "outbox").glob("*.json"))) == 1
    server = start_server(f"sqlite:///{db}", db, tmp_path / "server.log", port=int(port))
    try:
        assert _stored(server.url, kind) == 0
        pushed = subprocess.run([sys.executable, "-m", "tunecache_cli", "push", "--server",
                                 server.url], env=env, capture_output=True, text=True,
                                timeout=120)  # fmt: skip
        assert pushed.returncode == 0, pushed.stderr
        assert "pushed 1 of 1 waiting upload to" in pushed.stderr
        assert list((tmp_path / "outbox").glob("*.json")) == []
        assert _stored(server.url, kind) == (1 if kind == "record" else 2)  # the GEMMs' groups
    finally:
        server.stop()


def test_a_background_upload_the_server_never_took_waits_for_push(
    server: LiveServer, own_outbox: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The drop-in's upload of a winner it tuned (``Client.upload_later``): its server down
    until the process closed, the record was lost (a warning said so); now it waits in the
    outbox, and ``push`` sends it once a server is there."""
    import logging

    from cache_server.embedded import free_port
    from tunecache.http import Timeout

    down = f"http://127.0.0.1:{free_port()}"
    key = make_key(48)
    record = make_record(key)
    with caplog.at_level(logging.WARNING), \
            Client(down, timeout=Timeout(lookup=0.3, write=5)) as client:  # fmt: skip
        assert client.lookup(key, default={"d": 1}).source == "default"  # refused: down
        assert client.upload_later(record)
    assert outbox.waiting(down, own_outbox) == 1
    assert any("waits in" in r.getMessage() and str(own_outbox) in r.getMessage()
               and f"(tunecache push --server {down} sends it)" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]  # fmt: skip
    with Client(server.url) as client:
        assert outbox.push(client, down, own_outbox)[:3] == (1, 0, None)
        assert client.lookup(key, default={"d": 1}).config == record.config
    assert outbox.waiting(down, own_outbox) == 0


def test_a_background_upload_leaves_the_outbox_once_sent_or_refused(
    server: LiveServer, own_outbox: Path
) -> None:
    import httpx

    with Client(server.url) as client:
        assert client.upload_later(make_record(make_key(40)))
        assert client.drain(timeout=10)
    assert list(own_outbox.iterdir()) == []  # sent: nothing kept

    def invalid(request: httpx.Request) -> httpx.Response:
        return httpx.Response(422, json={"detail": "key: not valid here"},
                              headers={"Tunecache-Server": "tunecache/0"})  # fmt: skip

    with Client("http://strict.test", transport=httpx.MockTransport(invalid)) as client:
        assert client.upload_later(make_record(make_key(40)))
        assert client.drain(timeout=10)
    assert [p.name for p in own_outbox.iterdir()] == ["rejected"]  # kept to be read, not sent
    assert len(list((own_outbox / "rejected").iterdir())) == 1


@pytest.mark.slow
def test_a_tune_refused_as_bad_input_sends_nothing_waiting(
    server: LiveServer, tmp_path: Path
) -> None:
    """A tune exits 2 when it cannot run here (Triton under its interpreter: no time is
    meaningful), and exit 2 means nothing was stored: it sent the outbox's waiting uploads first,
    stored under this tune's token, then refused. They go just before a tune's own upload."""
    folder = tmp_path / "outbox"
    outbox.release(outbox.put(server.url, make_record(make_key(m=8)), folder))
    env = {**os.environ, "TUNECACHE_OUTBOX": str(folder), "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "tunecache_cli", "tune", "matmul", "--backend",
                           "triton", "--shape", "M=64,N=64,K=64", "--trials", "2", "--server",
                           server.url], env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2 and "cannot tune triton here" in done.stderr, done.stderr
    assert "pushed" not in done.stderr, done.stderr
    assert waiting_for(server.url, folder) == 1 and _stored(server.url, "record") == 0
    env.pop("TRITON_INTERPRET")  # the next tune that uploads sends it first
    done = subprocess.run([sys.executable, "-m", "tunecache_cli", "tune", "softmax", "--backend",
                           "tvm", "--shape", "M=64,N=64", "--trials", "2", "--server",
                           server.url], env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"pushed 1 waiting upload(s) to {server.url}" in done.stderr, done.stderr
    assert waiting_for(server.url, folder) == 0 and _stored(server.url, "record") == 2
