"""The API does what its OpenAPI document says: schemathesis (pinned in ``[dev]``) fuzzes a real
server on loopback, on SQLite and on PostgreSQL, in every phase (examples, coverage, fuzzing,
stateful), with the checks ``not_a_server_error``, ``status_code_conformance``,
``content_type_conformance`` and ``response_schema_conformance``; with no token and with a token
of each scope. The admin run must reach the success paths: the test counts, from the run's HAR
report, a 2xx for uploads, lookups, misses, job claims and snapshots (export and import).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer
from tests.factories import AUTH, TEST_TOKEN

pytestmark = pytest.mark.slow
pytest.importorskip("schemathesis")

CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
SUCCESS_PATHS = [("POST", "/v1/records"), ("POST", "/v1/lookup"), ("POST", "/v1/misses"),
                 ("POST", "/v1/jobs/claim"), ("GET", "/v1/snapshot"), ("POST", "/v1/snapshot")]  # fmt: skip


def fuzz(url: str, token: str | None, tmp: Path, *, examples: int, phases: str) -> tuple[str, Path]:
    """One schemathesis run (a fixed seed: the same cases every time); its output and HAR file."""
    har = tmp / f"run-{token[:12] if token else 'none'}.har"
    command = [sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json",
               "--checks", CHECKS, "--phases", phases, "--max-examples", str(examples),
               "--seed", "1", "--workers", "1", "--report", "har", "--report-har-path", str(har),
               "--no-color"]  # fmt: skip
    if token is not None:
        command += ["-H", f"Authorization: Bearer {token}"]
    done = subprocess.run(command, cwd=tmp, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    return output, har


def statuses(har: Path, paths: list[str]) -> Counter[tuple[str, str, int]]:
    """``(method, path template, status class)`` → how many answers, from a HAR report."""
    templates = [(p, re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", p) + "$")) for p in paths]
    counts: Counter[tuple[str, str, int]] = Counter()
    for entry in json.loads(har.read_text())["log"]["entries"]:
        path = httpx.URL(entry["request"]["url"]).path
        template = next((p for p, rx in templates if rx.match(path)), path)
        counts[(entry["request"]["method"], template, entry["response"]["status"] // 100)] += 1
    return counts


def token(url: str, scope: str) -> str:
    answer = httpx.post(f"{url}/v1/tokens", json={"name": f"fuzz-{scope}", "scope": scope},
                        headers=AUTH, timeout=30)  # fmt: skip
    assert answer.status_code == 201, answer.text
    made: str = answer.json()["token"]
    return made


def test_the_api_keeps_its_contract_under_fuzzing(any_server: LiveServer, tmp_path: Path) -> None:
    url = any_server.url
    paths = list(httpx.get(f"{url}/openapi.json", timeout=30).json()["paths"])
    cases = 0
    # Smaller scopes and none first: the admin run may create and revoke tokens.
    for who in (None, token(url, "read"), token(url, "write")):
        _, har = fuzz(url, who, tmp_path, examples=3, phases="examples,coverage,fuzzing")
        cases += sum(statuses(har, paths).values())
    output, har = fuzz(url, TEST_TOKEN, tmp_path, examples=25,
                       phases="examples,coverage,fuzzing,stateful")  # fmt: skip
    counts = statuses(har, paths)
    cases += sum(counts.values())
    assert cases >= 1000, output[-3000:]
    missing = [f"{m} {p}" for m, p in SUCCESS_PATHS if counts[(m, p, 2)] == 0]
    assert not missing, f"no 2xx for {missing}: {sorted(counts.items())}"
    # More uploads accepted than the document's one worked example: generated bodies too.
    assert counts[("POST", "/v1/records", 2)] >= 2, sorted(counts.items())
    assert not any(status == 5 for _, _, status in counts), sorted(counts.items())
    health = httpx.get(f"{url}/health", timeout=30)
    assert health.status_code == 200 and health.json()["records"] >= 1
