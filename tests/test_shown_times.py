"""Every place that shows a record's time shows the one the server ranks it by: once a verifier
re-timed a record, its time, marked as the verifier's (the uploader's claim of 0.2 ms, found
ten times too fast, stood in the dashboard's index and in ``tunecache records ls`` while the
record page, ``tunecache get`` and the ranking used the verifier's 2 ms). A real server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import LiveServer
from tests.factories import CPU, knobs, make_key, make_record
from tests.test_trust import _passed, token
from tunecache import Client

REPO = Path(__file__).resolve().parents[1]


def test_a_re_timed_record_shows_the_verifiers_time_everywhere(server: LiveServer) -> None:
    url = server.url
    with Client(url) as client:
        claimed = client.upload(make_record(make_key(m=64), time_ms=0.2, config=knobs(1)))
        plain = client.upload(make_record(make_key(m=128), time_ms=0.7, config=knobs(2)))
    with Client(url, token=token(url, "gpu-verifier", "verify")) as client:
        task = client.claim_verification("v1", device_arch=CPU.arch, backends=["tvm"])
        assert task is not None and task.record.id == claimed.record_id
        settled = client.submit_verification(claimed.record_id, _passed("v1", 2.0))
    assert settled.status == "verified" and settled.verification is not None
    assert settled.verification.timing_flag

    html = httpx.get(f"{url}/", timeout=30).text
    cells = list(re.findall(r'class="num time"[^>]*>([\d.]+)[^<]*(?:<span[^>]*>[^<]*</span>)?'
                            r'.*?">record (\d+)<', html, flags=re.S))  # fmt: skip
    times = {int(record): value for value, record in cells}
    assert times == {claimed.record_id: "2", plain.record_id: "0.7"}
    assert "verifier's</span>" in html and "its uploader said 0.2 ms" in html

    listed = subprocess.run(
        [sys.executable, "-m", "tunecache_cli", "records", "ls", "--server", url],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=dict(os.environ),
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines() if line.startswith("#")}
    assert re.search(r" 2 v +- ", rows[f"#{claimed.record_id}"])  # its time; no "vs eager"
    assert re.search(r" 0\.7 +\S+ ", rows[f"#{plain.record_id}"])
    assert " 0.2 " not in rows[f"#{claimed.record_id}"] and " v " not in rows[f"#{plain.record_id}"]
    assert "the verifier's time (v)" in listed.stdout


def test_an_interpreter_time_is_marked_in_the_listings(server: LiveServer) -> None:
    """A Triton drop-in record timed by the interpreter on the host (9.73 ms, "3.54x faster")
    stood in ``records ls`` and the dashboard's index as a time like any other; only the record
    itself said "not a GPU's time". Both listings now mark it."""
    from tunecache.measured import INTERPRETER_TIMER

    record = make_record(make_key(m=64), time_ms=9.73)
    timing = record.timing.model_copy(update={"timer": INTERPRETER_TIMER})
    with Client(server.url) as client:
        stored = client.upload(record.model_copy(update={"timing": timing}))
    html = httpx.get(f"{server.url}/", timeout=30).text
    assert '<span class="badge interpreter" title="host clock, Triton&#39;s interpreter' in html
    listed = subprocess.run(
        [sys.executable, "-m", "tunecache_cli", "records", "ls", "--server", server.url],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=dict(os.environ),
    )  # fmt: skip
    (row,) = [
        line for line in listed.stdout.splitlines() if line.startswith(f"#{stored.record_id}")
    ]
    assert " 9.73 " in row and " interpreter " in row


def test_a_speedup_of_one_round_says_it_has_no_spread() -> None:
    """A tune whose comparison with torch eager ran one round (``--seconds 1e-9``) showed a bare
    "1.29x faster than torch eager" in ``get``, ``records ls``, ``best`` and the dashboard, where
    the same config's ten rounds had said 2.05x (1.47-2.14x): a bare ratio reads as certain.
    ``tune --torch`` already said "(one round: no spread)"; every listing now does."""
    from tunecache.measured import Speedup
    from tunecache.timing import versus

    record = make_record(make_key(m=64), time_ms=1.0)
    (eager,) = record.baselines

    def compared(rounds: int) -> str:
        ratio = Speedup(median=1.29, low=1.29 if rounds == 1 else 1.1, high=1.29 if rounds == 1
                        else 1.5, rounds=rounds)  # fmt: skip
        baseline = eager.model_copy(update={"speedup": ratio})
        return versus(record.model_copy(update={"baselines": [baseline]}), than="torch eager")

    assert compared(1) == "1.29x faster than torch eager (one round: no spread)"
    assert compared(10) == "1.29x faster than torch eager (1.10-1.50x)"


def test_a_record_uploaded_but_not_read_back_says_so() -> None:
    """A tune whose upload was stored but whose read-back failed showed "stored no (validated
    here)" above "uploaded record #12": it now says it was stored, as what id."""
    from tunecache_cli.get import describe

    record = make_record(make_key(m=64))
    assert "stored     no (validated here)" in describe(record)
    said = describe(record, uploaded=12)
    assert "stored     as #12; not read back" in said and "stored     no" not in said
