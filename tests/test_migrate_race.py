"""Servers and ``db upgrade`` runs started together on one PostgreSQL database take turns on the
schema (an advisory lock, :func:`cache_server.migrate.migration_lock`): all of them succeed, and
the schema is at head. Unserialised, two of three failed with ``duplicate key value violates
unique constraint "pg_type_typname_nsp_index"``, and from revision 0010 one with Alembic's
"expected to match one row"."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cache_server.db import make_engine
from cache_server.migrate import current_revision, head_revision, upgrade

RUNNERS = 4
# Each runner imports everything, says so, and migrates only when told: all start together.
RUNNER = """
import sys
from cache_server.migrate import upgrade
print("ready", flush=True)
sys.stdin.readline()
upgrade(sys.argv[1])
"""
_made = iter(range(1_000_000))


@pytest.mark.parametrize("start", [None, "0010"])
def test_upgrades_started_together_all_succeed(postgres_admin: str, start: str | None) -> None:
    from tests.pg import create_database

    url = create_database(postgres_admin, f"race_{os.getpid()}_{next(_made)}")
    if start is not None:
        upgrade(url, start)
    runners = [subprocess.Popen([sys.executable, "-c", RUNNER, url], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(RUNNERS)]  # fmt: skip
    for runner in runners:
        assert runner.stdout is not None and runner.stdout.readline().strip() == "ready"
    for runner in runners:
        assert runner.stdin is not None
        runner.stdin.write("go\n")
        runner.stdin.flush()
    failures = []
    for runner in runners:
        _, err = runner.communicate(timeout=120)
        if runner.returncode != 0:
            failures.append([line for line in err.splitlines() if "Error" in line][-1:])
    assert not failures, failures
    engine = make_engine(url)
    assert current_revision(engine) == head_revision()
    engine.dispose()


def test_a_waiter_that_finds_the_schema_current_changes_nothing(postgres_admin: str) -> None:
    """The lock is given back after each run: upgrades one after another each take it."""
    from tests.pg import create_database

    url = create_database(postgres_admin, f"race_{os.getpid()}_{next(_made)}")
    for _ in range(2):
        upgrade(url)
    engine = make_engine(url)
    assert current_revision(engine) == head_revision()
    engine.dispose()
