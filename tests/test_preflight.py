"""Before any work, the commands that write check the server answers and the token may write."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import LiveServer
from tunecache.client import Client
from tunecache.errors import ServerError

REPO = Path(__file__).resolve().parents[1]
MANIFEST = """
[[tune]]
kernel = "matmul"
backends = ["tvm"]
shapes = [{M = 8, N = 8, K = 8}]
"""
TUNE = ["tune", "matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=8", "--trials", "2"]
TUNE_TORCH = ["tune", "--torch", "{tmp}/model.py:f"]
DAEMON = ["daemon", "--once"]
PRETUNE = ["pretune", "{tmp}/manifest.toml", "--no-wait"]


def cli(
    tmp: Path, argv: list[str], url: str, token: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    (tmp / "manifest.toml").write_text(MANIFEST)
    (tmp / "model.py").write_text(
        "import torch\ndef f(x): return x\ndef get_inputs(): return [torch.ones(2)]\n"
    )
    env = {**os.environ, "TUNECACHE_TOKEN": token}
    begin = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tunecache_cli", *[a.format(tmp=tmp) for a in argv], "--server", url],
        capture_output=True, text=True, timeout=300, cwd=tmp, env=env,
    )  # fmt: skip
    return done, time.monotonic() - begin


@pytest.fixture(scope="module")
def reader(shared_server: LiveServer) -> str:
    with Client(shared_server.url) as admin:
        return admin.create_token("preflight-reader", "read").token


@pytest.mark.parametrize(
    "argv", [TUNE, TUNE_TORCH, DAEMON, PRETUNE], ids=["tune", "torch", "daemon", "pretune"]
)
def test_a_read_token_is_refused_before_any_work(
    shared_server: LiveServer, reader: str, tmp_path: Path, argv: list[str]
) -> None:
    done, seconds = cli(tmp_path, argv, shared_server.url, reader)
    assert done.returncode == 4, done.stderr
    assert "needs the 'write' scope; token 'preflight-reader' has read" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert seconds < 30  # a search would take far longer; the check itself is one request
    with Client(shared_server.url) as client:
        assert client.list_jobs().count == 0  # pretune queued nothing


@pytest.mark.parametrize("argv", [TUNE, DAEMON, PRETUNE], ids=["tune", "daemon", "pretune"])
def test_an_unknown_token_is_refused_in_one_line(
    shared_server: LiveServer, tmp_path: Path, argv: list[str]
) -> None:
    done, _ = cli(tmp_path, argv, shared_server.url, "tc_" + "0" * 43)
    assert done.returncode == 4, done.stderr
    assert "refuses the token in $TUNECACHE_TOKEN (unknown or revoked)" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "argv", [TUNE, TUNE_TORCH, DAEMON, PRETUNE], ids=["tune", "torch", "daemon", "pretune"]
)
def test_a_dead_server_is_exit_3_before_any_work(tmp_path: Path, argv: list[str]) -> None:
    done, _ = cli(tmp_path, argv, "http://127.0.0.1:9", "tc_" + "1" * 43)
    assert done.returncode == 3, done.stderr
    assert "the server is not answering" in done.stderr and "Traceback" not in done.stderr


def test_whoami_says_who_the_token_is(shared_server: LiveServer, reader: str) -> None:
    with Client(shared_server.url, token=reader) as client:
        me = client.whoami()
    assert me.token is not None and me.token.name == "preflight-reader"
    assert (me.scope, me.reads) == ("read", "open")
    with Client(shared_server.url, token="") as anonymous:
        assert anonymous.whoami().token is None
    with (
        Client(shared_server.url, token="tc_" + "2" * 43) as unknown,
        pytest.raises(ServerError) as refused,
    ):
        unknown.whoami()
    assert refused.value.status_code == 401


class _NotOurs(http.server.BaseHTTPRequestHandler):
    """A web server that is not tunecache: 404 for one path, an HTML page for every other."""

    def do_GET(self) -> None:
        page = b"<html><body>hello</body></html>"
        missing = getattr(self.server, "missing", False)
        self.send_response(404 if self.path.startswith("/v1/whoami") and missing else 200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("missing", [True, False], ids=["404", "200-html"])
@pytest.mark.parametrize("argv", [TUNE, PRETUNE], ids=["tune", "pretune"])
def test_a_server_that_is_not_tunecache_is_refused_before_any_work(
    tmp_path: Path, argv: list[str], missing: bool
) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotOurs)
    server.missing = missing  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        done, seconds = cli(tmp_path, argv, url, "tc_" + "3" * 43)
    finally:
        server.shutdown()
    assert done.returncode == 2, done.stderr
    assert f"{url} is not a tunecache server" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert seconds < 30  # before any search: a tune of even 2 trials takes longer here
