"""The job queue through a real server, on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer, start_server
from tests.factories import AUTH, CPU, issue_token, knobs, make_key, make_record
from tunecache.device import DeviceFingerprint
from tunecache.key import Key

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


def _upload(http: httpx.Client, key: Key, headers: dict[str, str] | None = None) -> int:
    body = make_record(key).model_dump(mode="json", by_alias=True)
    answer = http.post("/v1/records", json=body, headers=headers)
    assert answer.status_code == 201, answer.text
    record_id: int = answer.json()["record_id"]
    return record_id


def finish(
    http: httpx.Client,
    job: dict,
    worker: str,
    headers: dict[str, str] | None = None,  # type: ignore[type-arg]
) -> httpx.Response:
    """Completes ``job`` as ``worker`` with a record of its key, uploaded now."""
    record_id = _upload(http, Key.from_json(job["key"]), headers)
    return http.post(f"/v1/jobs/{job['id']}/complete",
                     json={"worker": worker, "record_id": record_id}, headers=headers)  # fmt: skip


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
        order = [claim(http, f"w{i}")["key"]["problem"]["M"] for i in range(3)]  # type: ignore[index]
        assert claim(http, "w3") is None
    assert order == [3, 2, 1]


def test_a_claim_names_the_kernel_packages_it_may_import(any_server: LiveServer) -> None:
    """A built-in kernel's job goes to anyone; a user's kernel's only to a worker that named its
    package (or a package above it); a look-alike prefix, a LIKE wildcard or another case
    matches nothing."""
    kernels = {1: "matmul", 2: "pkg.mod:Kernel", 3: "pkg:Kernel", 4: "pkgx.mod:Kernel",
               5: "pkg_sub.mod:Kernel", 6: "other.deep.mod:Kernel", 7: "PKG.mod:Kernel"}  # fmt: skip
    workers = itertools.count()
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        for m, kernel in kernels.items():
            key = {**make_key(m=m).to_json(), "kernel": kernel}
            assert http.post("/v1/jobs", json={"key": key}).status_code == 201

        def claims(packages: list[str] | None) -> set[int]:
            got = set()
            while True:  # a worker works one job at a time: each claim is another worker's
                body = {"worker": f"w{next(workers)}", "lease_seconds": 60,
                        "kernel_packages": packages}  # fmt: skip
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


def test_a_claim_limited_to_keys_takes_only_their_jobs(any_server: LiveServer) -> None:
    """``pretune --local`` claims its manifest's keys only: it took whatever anyone had queued
    first (a write token's job of a million trials, an hour's tune) before its own."""
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        foreign = create(http, 1, priority=1000).json()["job"]
        mine = [create(http, m).json()["job"] for m in (2, 3)]
        wanted = [job["key_hash"] for job in mine]

        def take(worker: str, hashes: list[str]) -> int | None:
            body = {"worker": worker, "lease_seconds": 60, "key_hashes": hashes}
            response = http.post("/v1/jobs/claim", json=body)
            assert response.status_code in (200, 204), response.text
            return None if response.status_code == 204 else response.json()["key"]["problem"]["M"]

        assert {take("w1", wanted), take("w2", wanted)} == {2, 3}
        assert take("w3", wanted) is None  # the foreign job, most urgent, is not handed out
        bad = [http.post("/v1/jobs/claim", json={"worker": "w", "key_hashes": hashes})
               for hashes in ([], ["ab%"], ["0" * 64] * 4097)]  # fmt: skip
        assert claim(http, "w4")["id"] == foreign["id"]  # type: ignore[index]
    assert [b.status_code for b in bad] == [422, 422, 422]
    assert all("key_hashes" in b.text for b in bad)


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
                done = finish(http, job, name)
                assert done.status_code == 200, done.text  # one job at a time: done, the next

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counts = Counter(claimed)
    assert len(counts) == 40 and set(counts.values()) == {1}


def test_a_claim_asked_again_hands_back_the_workers_own_job(any_server: LiveServer) -> None:
    """A claim whose answer was lost (a timeout, a proxy) is asked again: the worker was leased
    a second job, the first held for no one until its lease ran out, one of its attempts spent
    for nothing (three lost answers failed a job never run). Now a worker holding a live lease
    is handed that job again, its lease as it was (a heartbeat renews it: a worker claiming in a
    loop does not keep its job for good); another worker, or the same name under another token,
    is not."""
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        create(http, 21)
        create(http, 22)
        first = claim(http, "w", lease=30)
        again = claim(http, "w", lease=60)
        assert first is not None and again is not None
        assert (again["id"], again["attempts"]) == (first["id"], 1)
        assert again["lease_expires_at"] == first["lease_expires_at"]
        other = issue_token(any_server.url, "write")
        with httpx.Client(headers={"Authorization": f"Bearer {other}"}, base_url=any_server.url,
                          timeout=30) as theirs:  # fmt: skip
            assert claim(theirs, "w")["id"] not in (first["id"], None)  # type: ignore[index]
        assert claim(http, "v") is None  # both leased
        done = finish(http, first, "w")
        assert done.status_code == 200 and claim(http, "w") is None  # done: nothing left


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
        late = finish(http, first, "slow")
        assert late.status_code == 409  # the lease moved on
        done = finish(http, first, "fast")
        assert done.status_code == 200 and done.json()["state"] == "done"
        assert claim(http, "fast") is None


def test_a_lease_that_runs_out_on_the_last_attempt_fails_the_job(any_server: LiveServer) -> None:
    """A job whose worker died on its last attempt stayed ``running`` for good (no worker may
    claim it again): a pretune following it waited for ever. The next claim fails it."""
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        create(http, 11, max_attempts=1)
        job = claim(http, "dies", lease=0.3)
        assert job is not None
        time.sleep(0.8)
        assert claim(http, "other") is None
        (failed,) = http.get("/v1/jobs", params={"state": "failed"}).json()["items"]
    assert failed["id"] == job["id"] and "last attempt" in failed["error"]
    assert failed["lease_owner"] is None


def test_a_job_failed_by_a_lapsed_lease_names_the_token_whose_lease_it_was(
    any_server: LiveServer,
) -> None:
    """A write token claimed with leases of a millisecond under made-up worker names: every job
    of the queue failed in 3 s, the server named as the failure's author and nothing said whose
    leases they were. The error names the token (an admin revokes it, and asks for the keys
    again: the next test)."""
    url = any_server.url
    honest, lapser = issue_token(url, "write"), issue_token(url, "write")  # test-write, -2
    with httpx.Client(headers=AUTH, base_url=url, timeout=30) as http:
        for m in (31, 32, 33):
            assert create(http, m, max_attempts=1).status_code == 201

        def lapsing(token: str, worker: str) -> int:
            answer = http.post("/v1/jobs/claim", json={"worker": worker, "lease_seconds": 0.001},
                               headers={"Authorization": f"Bearer {token}"})  # fmt: skip
            time.sleep(0.005)
            return answer.status_code

        assert lapsing(honest, "h") == 200
        assert [lapsing(lapser, f"x{n}") for n in range(3)] == [200, 200, 204]
        failed = [j["error"] for j in http.get("/v1/jobs", params={"state": "failed"}
                                               ).json()["items"]]  # fmt: skip
    assert len(failed) == 3, failed
    assert sorted(error.rsplit("the lease was token ", 1)[1] for error in failed) == [
        "test-write", "test-write-2", "test-write-2"]  # fmt: skip


def test_a_job_whose_attempts_a_token_spent_is_queued_again_when_asked_for(
    any_server: LiveServer,
) -> None:
    """A write token claiming with leases of a millisecond spent a job's every attempt in 0.06 s,
    and the key could never be tuned again: a miss, an admin's ``POST /v1/jobs`` (100 attempts)
    got the failed job back. Asking for the key again queues it, with that request's attempts
    and budget; a miss still gets the job as it is."""
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        create(http, 13, max_attempts=2)
        for worker in ("a", "b", "c"):
            claim(http, worker, lease=0.001)
            time.sleep(0.05)
        (failed,) = http.get("/v1/jobs", params={"state": "failed"}).json()["items"]
        miss = http.post("/v1/misses", json={"key": make_key(m=13).to_json()}).json()
        assert miss["job"]["state"] == "failed" and not miss["created"]
        again = create(http, 13, max_attempts=5, strategy="random", trials=7)
        assert again.status_code == 200, again.text
        job = again.json()["job"]
        assert (job["id"], job["state"], job["attempts"]) == (failed["id"], "queued", 0)
        assert (job["max_attempts"], job["strategy"], job["trials"]) == (5, "random", 7)
        assert claim(http, "honest")["id"] == failed["id"]  # type: ignore[index]
        assert create(http, 13).json()["job"]["state"] == "running"  # a live job is left alone


def test_revoking_a_token_gives_back_the_jobs_it_holds(any_server: LiveServer) -> None:
    """One write token leased every queued job for a day under made-up worker names, and
    revoking it freed none of them: now each is queued again at once, its attempt refunded."""
    url = any_server.url
    hoarder = issue_token(url, "write")
    with httpx.Client(base_url=url, timeout=30) as http:
        for m in (21, 22):
            assert http.post("/v1/jobs", json={"key": make_key(m=m).to_json()},
                             headers=AUTH).status_code == 201  # fmt: skip
        held = [http.post("/v1/jobs/claim", json={"worker": f"h{i}", "lease_seconds": 86_400},
                          headers={"Authorization": f"Bearer {hoarder}"}).json()
                for i in range(2)]  # fmt: skip
        assert {j["state"] for j in held} == {"running"}
        tokens = http.get("/v1/tokens", headers=AUTH).json()["items"]
        (row,) = [t for t in tokens if t["scope"] == "write"]
        assert http.delete(f"/v1/tokens/{row['id']}", headers=AUTH).status_code == 200
        queued = http.get("/v1/jobs", params={"state": "queued"}, headers=AUTH).json()["items"]
        assert sorted(j["id"] for j in queued) == sorted(j["id"] for j in held)
        assert {(j["attempts"], j["lease_owner"]) for j in queued} == {(0, None)}
        gone = http.post(f"/v1/jobs/{held[0]['id']}/heartbeat", json={"worker": "h0"},
                         headers={"Authorization": f"Bearer {hoarder}"})  # fmt: skip
        assert gone.status_code == 401
        taken = http.post("/v1/jobs/claim", json={"worker": "honest"}, headers=AUTH).json()
        assert taken["id"] in {j["id"] for j in held}


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


def test_a_lease_is_held_by_the_token_that_claimed_it(any_server: LiveServer) -> None:
    """A worker's name is public (the job list shows it): another write token naming it can
    neither renew, fail nor complete the lease. The claiming token can; an admin's may end any
    lease (a job a lost worker holds)."""
    url = any_server.url
    mine = {"Authorization": f"Bearer {issue_token(url, 'write')}"}
    theirs = {"Authorization": f"Bearer {issue_token(url, 'write')}"}
    with httpx.Client(base_url=url, timeout=30) as http:
        for m in (11, 12):
            assert http.post("/v1/jobs", json={"key": make_key(m=m).to_json()},
                             headers=mine).status_code == 201  # fmt: skip
        job = http.post("/v1/jobs/claim", json={"worker": "gpu-3"}, headers=mine).json()
        running = http.get("/v1/jobs", params={"state": "running"}).json()["items"]
        owner = running[0]["lease_owner"]
        answer = {"worker": owner, "record_id": _upload(http, Key.from_json(job["key"]), mine)}
        for action, body in (("heartbeat", {"worker": owner}), ("fail", {"worker": owner}),
                             ("complete", answer)):  # fmt: skip
            taken = http.post(f"/v1/jobs/{job['id']}/{action}", json=body, headers=theirs)
            assert taken.status_code == 409, (action, taken.text)
            assert "this worker and this token" in taken.json()["detail"]
        assert http.get(f"/v1/jobs/{job['id']}").json()["state"] == "running"
        renewed = http.post(f"/v1/jobs/{job['id']}/heartbeat", json={"worker": "gpu-3"},
                            headers=mine)  # fmt: skip
        assert renewed.status_code == 200, renewed.text
        done = finish(http, job, "gpu-3", mine)
        assert done.status_code == 200 and done.json()["state"] == "done", done.text
        lost = http.post("/v1/jobs/claim", json={"worker": "lost"}, headers=mine).json()
        ended = http.post(f"/v1/jobs/{lost['id']}/fail", json={"worker": "lost", "error": "gone"},
                          headers=AUTH)  # fmt: skip
        assert ended.status_code == 200 and ended.json()["state"] == "queued", ended.text


def test_a_job_is_completed_only_with_a_record_that_answers_it(any_server: LiveServer) -> None:
    """No record, or a record of another problem (or kernel, kernel source, backend, dtype,
    arch), does not finish the job; one of its problem tuned on the worker's own device of the arch, with its own
    versions, does."""
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        create(http, 13)
        job = claim(http, "w")
        assert job is not None
        # Done with nothing: its key reported tuned with no record to check, nor to reopen by.
        bare = http.post(f"/v1/jobs/{job['id']}/complete", json={"worker": "w"})
        assert bare.status_code == 422 and "record_id" in bare.text, bare.text
        unrelated = _upload(http, make_key(m=14))
        refused = http.post(f"/v1/jobs/{job['id']}/complete",
                            json={"worker": "w", "record_id": unrelated})  # fmt: skip
        assert refused.status_code == 422, refused.text
        assert f"record {unrelated} does not answer job {job['id']}" in refused.json()["detail"]
        assert "problem" in refused.json()["detail"]
        assert http.get(f"/v1/jobs/{job['id']}").json()["state"] == "running"
        asked = make_key(m=13)
        # Another source of the kernel (a worker on another version): served to none who asked
        other = _upload(http, dataclasses.replace(asked, source_hash="0" * 16))
        refused = http.post(f"/v1/jobs/{job['id']}/complete",
                            json={"worker": "w", "record_id": other})  # fmt: skip
        assert refused.status_code == 422, refused.text
        assert 'its source_hash is "0000000000000000"' in refused.json()["detail"]
        assert http.get(f"/v1/jobs/{job['id']}").json()["state"] == "running"
        device = DeviceFingerprint(kind="cpu", arch=asked.device.arch, name="worker-cpu", units=8)
        local = dataclasses.replace(asked, device=device, environment={"apache-tvm": "0.28.0"})
        assert local.digest() != asked.digest()
        answered = _upload(http, local)
        done = http.post(f"/v1/jobs/{job['id']}/complete",
                         json={"worker": "w", "record_id": answered})  # fmt: skip
        assert done.status_code == 200, done.text
        assert (done.json()["state"], done.json()["record_id"]) == ("done", answered)


def test_a_job_is_not_completed_with_a_disputed_record(any_server: LiveServer) -> None:
    """A write token disputed its own upload (any token may) and completed a miss it claimed
    with it: the job was done with a record served under no policy, and every later miss of the
    key found it done. And a caller holding no lease was answered about the record (422, its
    key's lock taken) before the lease: now the lease first (409)."""
    from tests.test_trust import dispute_body, post_dispute

    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        create(http, 21)
        job = claim(http, "w")
        assert job is not None
        key = Key.from_json(job["key"])
        record_id = _upload(http, key)
        disputed = post_dispute(any_server.url, record_id, AUTH, dispute_body(key))
        assert disputed.status_code == 200 and disputed.json()["status"] == "disputed"
        unrelated = _upload(http, make_key(m=22))
        for worker, answer, said in (
            ("nobody", unrelated, "is not running under a lease of this worker"),
            ("w", record_id, f"record {record_id} answers no job: it is disputed"),
        ):
            refused = http.post(f"/v1/jobs/{job['id']}/complete",
                                json={"worker": worker, "record_id": answer})  # fmt: skip
            assert refused.status_code == 409 and said in refused.json()["detail"], refused.text
        assert http.get(f"/v1/jobs/{job['id']}").json()["state"] == "running"


def test_a_dispute_that_leaves_a_key_served_by_none_opens_its_done_job_again(
    any_server: LiveServer,
) -> None:
    """The same, the other way round: a write token completed a miss with its own upload (or
    answered a queued miss by uploading), then disputed the record. The job stayed done with a
    key served by none, its misses absorbed: now it is queued again, as after a rejection."""
    from tests.test_trust import dispute_body, post_dispute

    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        create(http, 23)
        job = claim(http, "w")
        assert job is not None
        done = finish(http, job, "w")
        assert done.status_code == 200 and done.json()["state"] == "done", done.text
        key = Key.from_json(job["key"])
        answered = http.post("/v1/misses", json={"key": make_key(m=24).to_json()})
        assert answered.status_code == 202, answered.text
        uploaded = _upload(http, make_key(m=24))  # answers the queued miss: done
        misses = {j["key"]["problem"]["M"]: j for j in http.get("/v1/jobs").json()["items"]}
        assert misses[24]["state"] == "done" and misses[24]["record_id"] == uploaded
        for record_id, asked in ((done.json()["record_id"], key), (uploaded, make_key(m=24))):
            disputed = post_dispute(any_server.url, record_id, AUTH, dispute_body(asked))
            assert disputed.json()["status"] == "disputed", disputed.text
        jobs = {j["key"]["problem"]["M"]: j for j in http.get("/v1/jobs").json()["items"]}
    for m in (23, 24):
        assert (jobs[m]["state"], jobs[m]["record_id"]) == ("queued", None), jobs[m]
        assert "was disputed by bootstrap: its key is served by none" in jobs[m]["error"]


def test_withdrawing_a_leaked_token_opens_the_jobs_its_records_answered_again(
    any_server: LiveServer,
) -> None:
    """A leaked write token completed a job it claimed with its own upload and answered queued
    misses by uploading. Revoked with ``withdraw``, its records are disputed: the keys they
    alone served are served by none, and their jobs are queued again (they stayed done, the
    keys untuned, their misses absorbed). A key an honest record still serves keeps its job."""
    from tests.test_token_withdrawal import _token_id
    from tests.test_trust import token

    url = any_server.url
    leaked = {"Authorization": f"Bearer {token(url, 'leaked', 'write')}"}

    def upload(http: httpx.Client, m: int, config: int, time_ms: float) -> None:
        body = make_record(make_key(m=m), config=knobs(config), time_ms=time_ms)
        answer = http.post("/v1/records", json=body.model_dump(mode="json", by_alias=True))
        assert answer.status_code == 201, answer.text

    with (httpx.Client(headers=AUTH, base_url=url, timeout=30) as http,
          httpx.Client(headers=leaked, base_url=url, timeout=30) as as_leaked):  # fmt: skip
        assert create(http, 23).status_code == 201
        for m in (24, 25):
            assert http.post("/v1/misses", json={"key": make_key(m=m).to_json()}).status_code == 202
        job = claim(as_leaked, "w")
        assert job is not None and job["key"]["problem"]["M"] == 23
        assert finish(as_leaked, job, "w").json()["state"] == "done"
        upload(as_leaked, 24, 1, 0.5)  # answers the queued misses
        upload(as_leaked, 25, 1, 0.5)
        upload(http, 25, 2, 2.0)  # an honest record, slower, at one of them
        before = {
            j["key"]["problem"]["M"]: j["state"] for j in http.get("/v1/jobs").json()["items"]
        }
        revoked = http.delete(f"/v1/tokens/{_token_id(url, 'leaked')}", params={"withdraw": True})
        assert revoked.status_code == 200 and revoked.json()["withdrawn"] == 3, revoked.text
        jobs = {j["key"]["problem"]["M"]: j for j in http.get("/v1/jobs").json()["items"]}
    assert before == {23: "done", 24: "done", 25: "done"}
    for m in (23, 24):
        assert (jobs[m]["state"], jobs[m]["record_id"]) == ("queued", None), jobs[m]
        assert jobs[m]["error"] == ("the records of token leaked were withdrawn: its key is "
                                    "served by none")  # fmt: skip
    assert jobs[25]["state"] == "done", jobs[25]  # the honest record serves its key


def test_an_upload_that_answers_a_queued_miss_completes_it(any_server: LiveServer) -> None:
    """A drop-in's (or a user's) tune uploads the key a miss queued: the miss is done, with that
    record. A record that is not the key's new winner (one that failed validation) answers
    nothing, a running job is its worker's, and a job asked for through /v1/jobs (a re-tune)
    stays queued; a built-in kernel's miss at a problem it does not take queues nothing."""
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        for m in (64, 96, 128):
            assert http.post("/v1/misses", json={"key": make_key(m=m).to_json()}).status_code == 202
        running = claim(http, "w1")  # the oldest miss, m=64
        assert running is not None and running["key"]["problem"]["M"] == 64
        assert create(http, 192).status_code == 201  # asked for, not a miss
        body = {m: make_record(make_key(m=m)).model_dump(mode="json", by_alias=True)
                for m in (64, 96, 192)}  # fmt: skip
        stored = {m: http.post("/v1/records", json=b).json() for m, b in body.items()}
        failed = make_record(make_key(m=128), passed=False).model_dump(mode="json", by_alias=True)
        assert http.post("/v1/records", json=failed).status_code == 201
        flagged = make_key(m=224).to_json()
        flagged["problem"]["layout"] = "row"
        refused = http.post("/v1/misses", json={"key": flagged})
        assert refused.status_code == 422 and "unknown layout" in refused.text, refused.text
        listed = {j["key"]["problem"]["M"]: j for j in http.get("/v1/jobs").json()["items"]}
    assert sorted(listed) == [64, 96, 128, 192]
    assert (listed[96]["state"], listed[96]["record_id"]) == ("done", stored[96]["record_id"])
    assert listed[64]["state"] == "running" and listed[64]["record_id"] is None
    assert listed[128]["state"] == "queued"  # a record that failed validation answers nothing
    assert listed[192]["state"] == "queued"  # a re-tune asked for is not a miss


def _reject(url: str, verifier: str, record_id: int) -> None:
    """A verifier claims ``record_id`` and fails it (the pending ones it claims before it, it
    gives back: they are claimable again only later)."""
    with httpx.Client(headers={"Authorization": f"Bearer {verifier}"}, base_url=url,
                      timeout=30) as http:  # fmt: skip
        asked = {"worker": "v", "device_arch": CPU.arch, "backends": ["tvm"]}
        while (task := http.post("/v1/verifications/claim", json=asked)).status_code == 200:
            if (other := task.json()["record"]["id"]) == record_id:
                break
            back = {"worker": "v", "outcome": "unverifiable", "device_name": "cpu"}
            assert http.post(f"/v1/records/{other}/verification", json=back).status_code == 200
        assert task.status_code == 200, task.text
        failed = make_record(make_key(), passed=False).validation.model_dump(mode="json")
        found = {"worker": "v", "outcome": "failed", "device_name": "cpu", "validation": failed}
        done = http.post(f"/v1/records/{record_id}/verification", json=found)
        assert done.status_code == 200 and done.json()["status"] == "rejected", done.text


def test_a_job_answered_by_a_record_a_verifier_rejects_is_open_again(
    any_server: LiveServer,
) -> None:
    """A write token's bad upload answered a miss; a verifier rejected it: the key had no
    winner and its misses found the job done, so it was never tuned. A job is queued again (and
    claimable) once the key of the record that answered it is served by none: answered by an
    upload of its key, by an earlier record since beaten, or by a worker's record (keyed with the
    worker's own device); while another record serves that key, it stays done."""
    verifier = issue_token(any_server.url, "verify")
    with httpx.Client(headers=AUTH, base_url=any_server.url, timeout=30) as http:
        # each record its own config: a verifier's rejection holds for the config at its key
        tiles = itertools.count(1)

        def upload(key: Key, time_ms: float = 1.0) -> int:
            record = make_record(key, time_ms=time_ms, config=knobs(next(tiles)))
            body = record.model_dump(mode="json", by_alias=True)
            stored = http.post("/v1/records", json=body)
            assert stored.status_code == 201, stored.text
            record_id: int = stored.json()["record_id"]
            return record_id

        def job(m: int) -> tuple[str, int | None]:
            listed = {j["key"]["problem"]["M"]: j for j in http.get("/v1/jobs").json()["items"]}
            return listed[m]["state"], listed[m]["record_id"]

        for m in (64, 96):
            assert http.post("/v1/misses", json={"key": make_key(m=m).to_json()}).status_code == 202
        bad = upload(make_key(m=64))
        assert job(64) == ("done", bad)  # answered
        _reject(any_server.url, verifier, bad)
        assert job(64) == ("queued", None)
        listed = http.get("/v1/jobs").json()["items"]
        reopened = next(j for j in listed if j["key"]["problem"]["M"] == 64)
        assert reopened["error"] == (f"record {bad} was rejected by verifier 'test-verify': "
                                     "its key is served by none")  # fmt: skip
        claimed = claim(http, "w")
        assert claimed is not None and claimed["id"] == reopened["id"]
        failed = http.post(f"/v1/jobs/{claimed['id']}/fail", json={"worker": "w", "error": "x"})
        assert failed.status_code == 200, failed.text

        first, faster = upload(make_key(m=96), 2.0), upload(make_key(m=96), 1.0)
        assert job(96) == ("done", first)
        _reject(any_server.url, verifier, first)  # `faster` serves the key
        assert job(96) == ("done", first)
        _reject(any_server.url, verifier, faster)  # none does: `first` answers nothing now
        assert job(96) == ("queued", None)

        def worker_tunes(m: int) -> int:
            """A worker claims the job of ``m`` and completes it with its own device's record."""
            held = claim(http, "w")
            assert held is not None and held["key"]["problem"]["M"] == m
            asked = make_key(m=m)
            device = DeviceFingerprint(kind="cpu", arch=asked.device.arch, name="worker-cpu",
                                       units=8)  # fmt: skip
            local = upload(dataclasses.replace(asked, device=device), time_ms=float(m))
            for rejected in (bad, first):  # a record never served answers nothing
                refused = http.post(f"/v1/jobs/{held['id']}/complete",
                                    json={"worker": "w", "record_id": rejected})  # fmt: skip
                assert refused.status_code == 409 and "rejected it" in refused.text, refused.text
            done = http.post(f"/v1/jobs/{held['id']}/complete",
                             json={"worker": "w", "record_id": local})  # fmt: skip
            assert done.status_code == 200 and done.json()["error"] == "", done.text
            return local

        assert create(http, 13).status_code == 201
        local = worker_tunes(13)
        assert job(13) == ("done", local)
        _reject(any_server.url, verifier, local)
        assert job(13) == ("queued", None)
        again = worker_tunes(13)  # the error of its re-opening is cleared
        assert create(http, 17, max_attempts=1).status_code == 201
        last = worker_tunes(17)
        _reject(any_server.url, verifier, last)
        assert job(17) == ("failed", None)  # out of attempts
        assert job(13) == ("done", again)  # another key's job is left alone


def test_a_claim_that_passed_its_token_check_before_a_revocation_leases_nothing(
    database: tuple[str, Path | None],
) -> None:
    """A claim authenticated just before its token was revoked ran its lease after the
    revocation had given the token's jobs back, and held a job for a day: the lease itself now
    needs the token live (the claim as the route runs it, after its check passed)."""
    from cache_server import jobs, tokens
    from cache_server.db import make_sessionmaker
    from cache_server.migrate import prepare

    engine = prepare(database[0])
    try:
        with make_sessionmaker(engine).begin() as session:
            _, admin = tokens.issue(session, name="admin", scope="admin")
            _, row = tokens.issue(session, name="hoarder", scope="write")
            key = make_key(m=31)
            jobs.enqueue(session, key)
            tokens.revoke(session, token_id=row.id)  # after the claim's token check
            assert (
                jobs.claim(
                    session, worker="w", token_id=row.id, token_name=row.name, lease_seconds=86_400
                )
                is None
            )
            taken = jobs.claim(
                session, worker="v", token_id=admin.id, token_name=admin.name, lease_seconds=60
            )
            assert taken is not None and taken.lease_token_id == admin.id
    finally:
        engine.dispose()


def test_a_completion_waits_for_a_verifier_deciding_its_record(server: LiveServer) -> None:
    """A verifier rejected the record between the completion's check and its write: the job
    was done with a record never served (the rejection reopens done jobs only). The completion
    reads the record behind its key's lock, as a finding is written, and finds it rejected."""
    import sqlite3

    assert server.db_path is not None
    with httpx.Client(headers=AUTH, base_url=server.url, timeout=30) as http:
        create(http, 17)
        job = claim(http, "w")
        assert job is not None
        record_id = _upload(http, Key.from_json(job["key"]))
        verifier = sqlite3.connect(server.db_path, isolation_level=None, timeout=30)
        verifier.execute("BEGIN IMMEDIATE")  # a finding being written, behind the write lock
        verifier.execute("UPDATE records SET status = 'rejected' WHERE id = ?", (record_id,))
        answers: list[httpx.Response] = []
        sent = threading.Thread(
            target=lambda: answers.append(
                http.post(
                    f"/v1/jobs/{job['id']}/complete", json={"worker": "w", "record_id": record_id}
                )
            )
        )
        sent.start()
        time.sleep(1.5)  # the completion is in, waiting
        verifier.execute("COMMIT")
        verifier.close()
        sent.join(30)
        assert answers and answers[0].status_code == 409, answers and answers[0].text
        assert "a verifier rejected it" in answers[0].json()["detail"]
        assert http.get(f"/v1/jobs/{job['id']}").json()["state"] == "running"
