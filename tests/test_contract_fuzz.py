"""The API does what its OpenAPI document says: schemathesis (pinned in ``[dev]``) fuzzes a real
server on loopback, on SQLite and on PostgreSQL, in every phase (examples, coverage, fuzzing,
stateful), with every check it has (``--checks all``: ``ignored_auth``,
``missing_required_header``, ``negative_data_rejection``, ``positive_data_acceptance``,
``allow_header_conformance``, ``unsupported_method`` among them); with no token and with a token
of each scope (those three runs on SQLite only: authentication is not the database's). The admin
run must reach the success paths: the test counts, from the run's HAR report, a 2xx for
uploads, lookups, misses, job claims and snapshots (export and import).

The exceptions, each with its reason (written to the run's ``schemathesis.toml``; the hooks in
:mod:`tests.fuzz_hooks`). ``negative_data_rejection`` takes 413 as a rejection (:data:`REJECTIONS`).
Generated bodies whose problem has no integer size are dropped (a rule JSON Schema says only with
``not``, which the coverage phase mishandles). ``positive_data_acceptance`` is off
(:data:`EXCEPTIONS`) where a body is valid only by a rule JSON Schema cannot say, so a
schema-valid body may rightly be refused with a 422:

- a record's ``config`` and an artifact's ``value`` pass their backend's or namespace's closed
  schema (:mod:`tunecache.configcheck`: which meta-parameters, launch options and TVM trace
  instructions may be served, their types and ranges per backend, chosen by ``key.backend``);
  a record also holds rules across its fields (``min_ms ≤ median_ms ≤ max_ms``, a trial has a
  time exactly when it ran, ``max_rel_error`` is its worst check's, a snapshot's records match
  its filters, a failed verification carries its failed check or an error);
- a key naming a built-in kernel (``matmul``) names exactly its shape parameters, each a size
  (a record's, a job's, a miss's: workers run it as that kernel);
- ``GET /v1/artifacts`` takes ``key`` or ``after``, not both (parameters are described one by
  one: OpenAPI cannot say two exclude each other).

Every other check runs on these operations too, and every check on every other operation.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer
from tests.factories import TEST_TOKEN, issue_token

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
pytest.importorskip("schemathesis")

# (method, path, why): positive_data_acceptance is off for these (see the module doc).
EXCEPTIONS = [
    ("POST", "/v1/records", "the config's closed schema per backend; rules across fields"),
    ("POST", "/v1/snapshot", "its records' closed config schemas; records match the filters"),
    ("POST", "/v1/artifacts", "each value's closed schema per namespace"),
    ("POST", "/v1/records/{record_id}/verification", "a failed outcome carries its failure"),
    ("GET", "/v1/artifacts", "key and after exclude each other"),
    ("POST", "/v1/jobs", "a built-in kernel's key names exactly its shape parameters"),
    ("POST", "/v1/misses", "a built-in kernel's key names exactly its shape parameters"),
]
# negative_data_rejection's statuses, and 413: a body invalid because it is too long (a list
# over its maxItems) may be refused for its size before it is parsed.
REJECTIONS = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]


def config(tmp: Path) -> list[str]:
    """Writes the run's ``schemathesis.toml``: every check schemathesis has, on; the
    :data:`EXCEPTIONS` and :data:`REJECTIONS`. Returns the checks' names."""
    import schemathesis.specs.openapi.checks  # noqa: F401  # registers the OpenAPI checks
    from schemathesis.checks import CHECKS

    names = sorted(CHECKS.get_all_names())
    lines = ["[checks]", *(f"{name}.enabled = true" for name in names),
             f"negative_data_rejection.expected-statuses = {json.dumps(REJECTIONS)}",
             ""]  # fmt: skip
    for method, path, why in EXCEPTIONS:
        lines += [f"[[operations]]  # {why}", f'include-method = "{method}"',
                  f'include-path = "{path}"', "checks.positive_data_acceptance.enabled = false",
                  ""]  # fmt: skip
    (tmp / "schemathesis.toml").write_text("\n".join(lines))
    return names


SUCCESS_PATHS = [("POST", "/v1/records"), ("POST", "/v1/lookup"), ("POST", "/v1/misses"),
                 ("POST", "/v1/jobs/claim"), ("GET", "/v1/snapshot"), ("POST", "/v1/snapshot")]  # fmt: skip


def fuzz(url: str, token: str | None, tmp: Path, *, examples: int, phases: str) -> tuple[str, Path]:
    """One schemathesis run (a fixed seed: the same cases every time); its output and HAR file."""
    har = tmp / f"run-{token[:12] if token else 'none'}.har"
    command = [sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json",
               "--phases", phases, "--max-examples", str(examples),
               "--seed", "1", "--workers", "1", "--report", "har", "--report-har-path", str(har),
               "--no-color"]  # fmt: skip
    if token is not None:
        command += ["-H", f"Authorization: Bearer {token}"]
    names = config(tmp)
    assert {"ignored_auth", "missing_required_header", "negative_data_rejection",
            "positive_data_acceptance", "allow_header_conformance",
            "unsupported_method"} <= set(names)  # fmt: skip
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.fuzz_hooks",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    done = subprocess.run(command, cwd=tmp, capture_output=True, text=True, timeout=300,
                          env=env)  # fmt: skip
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


def test_the_api_keeps_its_contract_under_fuzzing(any_server: LiveServer, tmp_path: Path) -> None:
    url = any_server.url
    paths = list(httpx.get(f"{url}/openapi.json", timeout=30).json()["paths"])
    cases = 0
    # Smaller scopes and none first: the admin run may create and revoke tokens. Those runs
    # check authentication and scopes, the server's and not its database's: on SQLite only.
    scoped = [None, issue_token(url, "read"), issue_token(url, "write")]
    for who in scoped if any_server.db.startswith("sqlite") else []:
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
