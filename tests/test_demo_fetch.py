"""The demo's fresh process fetches with the demo server's own token, whatever the shell holds.

After the README's flow 1 (``export TUNECACHE_TOKEN=...`` of the user's own server), ``tunecache
demo`` fetched every key as a MISS and exited 1, saying nothing: the fresh process sent the
user's token to the demo's server, which answered 401, and its words were kept back unless it
failed. Found by a newcomer's walk. Through a real server on loopback and a real fresh process.
"""

from __future__ import annotations

import pytest

from tests.conftest import LiveServer
from tests.factories import make_record
from tests.test_trust import token
from tunecache import Client
from tunecache.key import key_for
from tunecache_cli.demo import _fetch_in_fresh_process


def test_the_fresh_process_uses_the_demo_servers_token_not_the_shells(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = server.url
    spec = {"workload": "softmax", "backend": "tvm", "problem": {"M": 64, "N": 64},
            "dtype": "float32"}  # fmt: skip
    key = key_for(spec["workload"], "tvm", spec["problem"], "float32")
    demo = token(url, "demo", "write")
    with Client(url, token=demo) as client:
        record_id = client.upload(make_record(key)).record_id
    monkeypatch.setenv("TUNECACHE_TOKEN", "tc_of-the-users-own-server")  # unknown here
    rows = [{"spec": spec, "label": key.short(), "record": None}]
    (fetched,) = _fetch_in_fresh_process(url, demo, rows)
    assert fetched["hit"] and fetched["record_id"] == record_id, fetched

    (missed,) = _fetch_in_fresh_process(url, "tc_not-this-servers", rows)  # the miss says why
    assert not missed["hit"]
    assert "401" in capsys.readouterr().err
