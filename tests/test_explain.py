"""A miss explains itself: the nearest records, what differs, which policy would serve them."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import LiveServer
from tests.factories import make_record
from tunecache import key_for
from tunecache.client import Client
from tunecache.explain import differences, explain

REPO = Path(__file__).resolve().parents[1]
PROBLEM = {"M": 64, "N": 48, "K": 32}


def cli(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunecache_cli", *args, "--server", server.url],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=dict(os.environ))  # fmt: skip


def test_differences_name_each_field_that_differs() -> None:
    here = key_for("matmul", "tvm", PROBLEM, "float32").to_json()
    other = {**here, "dtype": "float64", "problem": {"M": 128, "N": 48, "K": 32},
             "environment": {**here["environment"], "apache-tvm": "0.26.0"}}  # fmt: skip
    found = differences(here, other)
    assert "dtype float64, not float32" in found
    assert any(d.startswith("apache-tvm 0.26.0, not ") for d in found)
    assert "shape M=128,N=48,K=32" in found
    (nearest,) = explain(here, [(7, other)])
    assert nearest.record_id == 7 and nearest.served_under is None  # another dtype: never


def test_get_explain_names_the_policy_that_would_serve_an_older_tvm(server: LiveServer) -> None:
    key = key_for("matmul", "tvm", PROBLEM, "float32")
    older = dict(key.environment)
    older["apache-tvm"] = "0.27.0.post0"  # same major.minor: the compatible policy serves it
    with Client(server.url) as client:
        client.upload(make_record(dataclasses.replace(key, environment=older), time_ms=1.0))
    shape = ",".join(f"{k}={v}" for k, v in PROBLEM.items())
    missed = cli(server, "get", "matmul", "--backend", "tvm", "--shape", shape, "--explain")
    assert missed.returncode == 1
    assert "under the strict version policy" in missed.stdout
    assert "#1: served with --policy compatible (exact rule)" in missed.stdout
    assert "apache-tvm 0.27.0.post0, not " in missed.stdout
    served = cli(server, "get", "matmul", "--backend", "tvm", "--shape", shape, "--policy",
                 "compatible", "--json")  # fmt: skip
    assert served.returncode == 0
    answer = json.loads(served.stdout)
    assert (answer["match"], answer["policy"]) == ("exact", "compatible")
    as_json = cli(server, "get", "matmul", "--backend", "tvm", "--shape", shape, "--explain",
                  "--json")  # fmt: skip
    (nearest,) = json.loads(as_json.stdout)["nearest"]
    assert nearest["served_under"] == "compatible" and nearest["record_id"] == 1


def test_records_ls_and_show(server: LiveServer) -> None:
    key = key_for("matmul", "tvm", PROBLEM, "float32")
    with Client(server.url) as client:
        client.upload(make_record(key, time_ms=0.5, trials=4))
    listed = cli(server, "records", "ls", "--kernel", "matmul")
    assert listed.returncode == 0 and "#1" in listed.stdout and "2.00x faster" in listed.stdout
    assert "1 of 1 winners" in listed.stdout
    assert cli(server, "records", "ls", "--kernel", "softmax").returncode == 1
    shown = cli(server, "records", "show", "1")
    assert shown.returncode == 0 and "4 trials; tuned in 1.0 s" in shown.stdout
    assert shown.stdout.count("compile_error") == 1  # the trial table, failures included
    assert json.loads(cli(server, "records", "show", "1", "--json").stdout)["id"] == 1
    assert cli(server, "records", "show", "99").returncode == 1
