"""The job queue through a real server, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer, start_server
from tests.factories import AUTH, make_key

pytestmark = pytest.mark.slow


def create(http: httpx.Client, m: int, **fields: object) -> httpx.Response:
    return http.post("/v1/jobs", json={"key": make_key(m=m).to_json(), **fields})


def claim(http: httpx.Client, worker: str, lease: float = 60.0) -> dict | None:  # type: ignore[type-arg]
    response = http.post("/v1/jobs/claim", json={"worker": worker, "lease_seconds": lease})
    if response.status_code == 204:
        return None
    assert response.status_code == 200, response.text
    job: dict = response.json()  # type: ignore[type-arg]
    return job


def test_jobs_are_deduplicated_by_key(any_server: LiveServer) -> None:
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        first = create(http, 64)
        again = create(http, 64, priority=5)
        miss = http.post("/v1/misses", json={"key": make_key(m=64).to_json()})
        other = http.post("/v1/misses", json={"key": make_key(m=65).to_json()})
    assert (first.status_code, again.status_code, miss.status_code) == (201, 200, 202)
    assert first.json()["created"] and not again.json()["created"] and not miss.json()["created"]
    assert again.json()["job"]["id"] == first.json()["job"]["id"] == miss.json()["job"]["id"]
    assert other.json()["created"] and other.json()["job"]["source"] == "miss"
    assert other.json()["job"]["priority"] < 0


def test_claims_follow_priority_then_age(any_server: LiveServer) -> None:
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        http.post("/v1/misses", json={"key": make_key(m=1).to_json()})
        create(http, 2)
        create(http, 3, priority=10)
        order = [claim(http, "w")["key"]["problem"]["M"] for _ in range(3)]  # type: ignore[index]
        assert claim(http, "w") is None
    assert order == [3, 2, 1]


def test_a_claim_names_the_kernel_packages_it_may_import(any_server: LiveServer) -> None:
    """A built-in kernel's job goes to anyone; a user's kernel's only to a worker that named its
    package (or a package above it); a look-alike prefix, a LIKE wildcard or another case
    matches nothing."""
    kernels = {1: "matmul", 2: "pkg.mod:Kernel", 3: "pkg:Kernel", 4: "pkgx.mod:Kernel",
               5: "pkg_sub.mod:Kernel", 6: "other.deep.mod:Kernel", 7: "PKG.mod:Kernel"}  # fmt: skip
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        for m, kernel in kernels.items():
            key = {**make_key(m=m).to_json(), "kernel": kernel}
            assert http.post("/v1/jobs", json={"key": key}).status_code == 201

        def claims(packages: list[str] | None) -> set[int]:
            got = set()
            while True:
                body = {"worker": "w", "lease_seconds": 60, "kernel_packages": packages}
                response = http.post("/v1/jobs/claim", json=body)
                if response.status_code == 204:
                    return got
                got.add(response.json()["key"]["problem"]["M"])

        assert claims([]) == {1}
        assert claims(["pk_"]) == set()  # "_" is no LIKE wildcard: pkg.mod is not in pk_
        assert claims(["pkg"]) == {2, 3}  # not PKG: package names are case-sensitive
        assert claims(["other.deep"]) == {6}
        assert claims(None) == {4, 5, 7}  # an old worker, naming none: anything left
        bad = http.post("/v1/jobs/claim", json={"worker": "w", "kernel_packages": ["a%"]})
    assert bad.status_code == 422


def test_concurrent_claimers_never_share_a_job(any_server: LiveServer) -> None:
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        for m in range(1, 41):
            assert create(http, m).status_code == 201
    claimed: list[int] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
            while (job := claim(http, name)) is not None:
                with lock:
                    claimed.append(job["id"])

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counts = Counter(claimed)
    assert len(counts) == 40 and set(counts.values()) == {1}


def test_an_expired_lease_is_claimed_again(any_server: LiveServer) -> None:
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        create(http, 7)
        first = claim(http, "slow", lease=0.5)
        assert first is not None and first["attempts"] == 1
        assert claim(http, "fast") is None  # leased, not expired yet
        alive = http.post(
            f"/v1/jobs/{first['id']}/heartbeat", json={"worker": "slow", "lease_seconds": 0.5}
        )
        assert alive.status_code == 200
        time.sleep(1.2)
        second = claim(http, "fast")
        assert second is not None and second["id"] == first["id"] and second["attempts"] == 2
        late = http.post(f"/v1/jobs/{first['id']}/complete", json={"worker": "slow"})
        assert late.status_code == 409  # the lease moved on
        done = http.post(f"/v1/jobs/{first['id']}/complete", json={"worker": "fast"})
        assert done.status_code == 200 and done.json()["state"] == "done"
        assert claim(http, "fast") is None


def test_failures_retry_until_the_limit(any_server: LiveServer) -> None:
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        create(http, 9, max_attempts=2)
        for expected in ("queued", "failed"):
            job = claim(http, "w")
            assert job is not None
            failed = http.post(f"/v1/jobs/{job['id']}/fail", json={"worker": "w", "error": "oom"})
            assert failed.json()["state"] == expected and failed.json()["error"] == "oom"
        assert claim(http, "w") is None
        listed = http.get("/v1/jobs", params={"state": "failed"}).json()
        assert listed["count"] == 1 and listed["items"][0]["attempts"] == 2


def test_bad_job_requests_are_4xx(any_server: LiveServer) -> None:
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        assert (
            http.post("/v1/jobs/claim", json={"worker": "w", "lease_seconds": -1}).status_code
            == 422
        )
        assert http.post("/v1/jobs/claim", json={"lease_seconds": 5}).status_code == 422
        assert http.post("/v1/jobs/5/heartbeat", json={"worker": "w"}).status_code == 409
        assert http.get("/v1/jobs/999").status_code == 404
        assert http.get("/v1/jobs", params={"state": "lost"}).status_code == 422
        assert create(http, 1, max_attempts=0).status_code == 422


def test_a_failed_job_waits_before_it_is_claimed_again(tmp_path: Path) -> None:
    """With the server's retry delay, a job that fails at once does not spend every attempt in
    a second: the next claim finds nothing until the delay has passed."""
    db = tmp_path / "cache.db"
    live = start_server(f"sqlite:///{db}", db, tmp_path / "server.log",
                        env={"TUNECACHE_SERVER_RETRY_SECONDS": "1.5"})  # fmt: skip
    try:
        with httpx.Client(headers=AUTH, base_url=live.url, timeout=30) as http:
            create(http, 9, max_attempts=3)
            job = claim(http, "w")
            assert job is not None
            failed = http.post(f"/v1/jobs/{job['id']}/fail", json={"worker": "w", "error": "x"})
            assert failed.json()["state"] == "queued"
            assert claim(http, "w") is None  # waiting its delay
            time.sleep(1.7)
            again = claim(http, "w")
            assert again is not None and again["attempts"] == 2
            http.post(f"/v1/jobs/{job['id']}/fail", json={"worker": "w", "error": "x"})
            time.sleep(1.7)  # the second delay is twice the first: 3 s
            assert claim(http, "w") is None
            time.sleep(1.5)
            assert claim(http, "w") is not None
    finally:
        live.stop()
