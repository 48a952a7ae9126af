"""A claim names the versions of the kernels its worker runs: no job of another version of one of
them is handed to it (it would fail the job, an attempt spent). Through a real server on SQLite
and PostgreSQL, and the migration that gives queued jobs the columns the claim filters on."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer
from tests.factories import AUTH, make_key, queue_at
from tunecache.jobs import MAX_CLAIM_SOURCES

pytestmark = pytest.mark.slow

# (kernel, backend, source hash) of each job queued, by its M.
QUEUED = {1: ("matmul", "tvm", "aaaa"), 2: ("matmul", "tvm", "bbbb"),
          3: ("matmul", "inductor", "bbbb"), 4: ("softmax", "tvm", "cccc"),
          5: ("pkg.mod:Kernel", "tvm", "dddd"), 6: ("pkg.mod:Kernel", "tvm", "eeee")}  # fmt: skip


def _key(m: int) -> dict[str, object]:
    kernel, backend, source = QUEUED[m]
    built_in = "matmul" if ":" in kernel else kernel  # a user's kernel: matmul's shape
    key = make_key(m=m, kernel=built_in, backend=backend).to_json()
    return {**key, "kernel": kernel, "source_hash": source}


def _queue(http: httpx.Client) -> None:
    for m in QUEUED:
        answer = http.post("/v1/jobs", json={"key": _key(m)})
        assert answer.status_code == 201, answer.text


def test_a_claim_naming_kernel_versions_takes_no_job_of_another_version(
    any_server: LiveServer,
) -> None:
    """Listed kernels are handed out in the listed versions only (two listed for one kernel:
    either), on the listed backend only; kernels and backends it does not list, in any."""
    workers = itertools.count()
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        _queue(http)

        def claims(sources: list[tuple[str, str, str]]) -> set[int]:
            got = set()
            listed = [{"kernel": k, "backend": b, "source_hash": h} for k, b, h in sources]
            while True:  # each claim another worker's: a worker holds one job at a time
                body = {"worker": f"w{next(workers)}", "lease_seconds": 60,
                        "kernel_packages": ["pkg"], "sources": listed}  # fmt: skip
                answer = http.post("/v1/jobs/claim", json=body)
                if answer.status_code == 204:
                    return got
                assert answer.status_code == 200, answer.text
                got.add(answer.json()["key"]["problem"]["M"])

        assert claims([("matmul", "tvm", "aaaa"), ("pkg.mod:Kernel", "tvm", "dddd"),
                       ("softmax", "tvm", "cccc")]) == {1, 3, 4, 5}  # fmt: skip
        assert claims([("matmul", "tvm", "aaaa"), ("pkg.mod:Kernel", "tvm", "dddd")]) == set()
        assert claims([("pkg.mod:Kernel", "tvm", "dddd"), ("pkg.mod:Kernel", "tvm", "eeee"),
                       ("matmul", "tvm", "aaaa")]) == {6}  # fmt: skip
        assert claims([]) == {2}  # an empty list names no kernel: any version
        jobs = http.get("/v1/jobs", params={"state": "running"}).json()["items"]
    assert len(jobs) == len(QUEUED)


def test_a_job_that_waited_a_day_for_its_version_goes_to_any_worker(any_server: LiveServer) -> None:
    """An old version's job, left queued when every daemon was upgraded, waited for good (each
    counted among its token's open jobs): after ``VERSION_WAIT_SECONDS`` (a day) since it was
    last written, a worker of another version is handed it (and fails it)."""
    import sqlalchemy as sa

    from cache_server.db import make_engine

    other = [{"kernel": "matmul", "backend": "tvm", "source_hash": "ffff"}]
    body = {"worker": "w", "lease_seconds": 60, "sources": other}
    engine = make_engine(any_server.db)

    def claimed_after(hours: int) -> httpx.Response:
        with engine.begin() as conn:  # as if queued that long ago
            then = datetime.now(UTC) - timedelta(hours=hours)
            conn.execute(sa.text("update jobs set updated_at = :then"), {"then": then})
        return http.post("/v1/jobs/claim", json=body)

    try:
        with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
            assert http.post("/v1/jobs", json={"key": _key(1)}).status_code == 201
            assert [claimed_after(h).status_code for h in (0, 23)] == [204, 204]
            old = claimed_after(25)
    finally:
        engine.dispose()
    assert old.status_code == 200, old.text
    assert old.json()["key"]["source_hash"] == "aaaa"


def test_a_claims_kernel_versions_are_bounded_and_checked(any_server: LiveServer) -> None:
    one = {"kernel": "matmul", "backend": "tvm", "source_hash": "ab"}
    bad = [[{**one, "source_hash": "AB%"}], [{**one, "backend": "cuda"}],
           [{**one, "kernel": "a b"}], [{"kernel": "matmul", "backend": "tvm"}],
           [one] * (MAX_CLAIM_SOURCES + 1), [{**one, "extra": 1}]]  # fmt: skip
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        answers = [http.post("/v1/jobs/claim", json={"worker": "w", "sources": s}) for s in bad]
        fine = http.post(
            "/v1/jobs/claim", json={"worker": "w", "sources": [one] * MAX_CLAIM_SOURCES}
        )
    assert [a.status_code for a in answers] == [422] * len(bad)
    assert all("sources" in a.text for a in answers)
    assert fine.status_code == 204  # nothing queued


def test_the_job_sources_migration_fills_in_the_jobs_queued_before_it(
    database: tuple[str, Path | None],
) -> None:
    """Jobs queued at 0022 get their key's kernel and source hash, so that a claim naming
    versions filters them like new ones, a key holding a NUL too (queued before NUL was refused;
    PostgreSQL cannot read such a key as text); downgrading drops the columns again."""
    import sqlalchemy as sa
    from alembic import command

    from cache_server.db import make_engine
    from cache_server.migrate import alembic_config, upgrade

    url = database[0]
    queued = {f"{m:064x}": (_key(m), backend) for m, (_, backend, _) in QUEUED.items()}
    nul = {**_key(1), "environment": {"apache-tvm": "0.27\u0000"}}
    queue_at(url, "0022", {**queued, f"{99:064x}": (nul, "tvm")})
    upgrade(url)
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            filled = conn.execute(sa.text("select key_hash, kernel, source_hash from jobs")).all()
        assert {int(h, 16): (k, s) for h, k, s in filled} == {
            **{m: (kernel, source) for m, (kernel, _, source) in QUEUED.items()},
            99: ("matmul", "aaaa"),
        }
        command.downgrade(alembic_config(url), "0022")
        columns = {c["name"] for c in sa.inspect(engine).get_columns("jobs")}
    finally:
        engine.dispose()
    assert not {"kernel", "source_hash"} & columns and "kernel_module" in columns
