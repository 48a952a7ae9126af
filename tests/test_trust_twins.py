"""A dispute or a verifier's rejection is a finding about a config at a key, not about one upload
of it: other records of the key holding the same config (uploaded before or after) follow it.

Before, a write token defeated every finding with copies: a disputed config's copy, uploaded
beforehand with another time, served the moment the dispute took the first one out; one uploaded
again after a verifier's rejection (one byte changed, so not the same upload) was served anew.
"""

from __future__ import annotations

import concurrent.futures

import httpx

from tests.conftest import LiveServer
from tests.factories import AUTH, CPU, knobs, make_key, make_record
from tests.test_trust import DEFAULT, dispute_body, post_dispute, token
from tunecache import Client
from tunecache.verification import VerificationCreate

BAD, GOOD = knobs(1), knobs(2)


def upload(
    url: str, config: dict[str, object], ms: float, headers: dict[str, str]
) -> httpx.Response:
    body = make_record(make_key(m=64), time_ms=ms, config=config).model_dump(mode="json",
                                                                          by_alias=True)  # fmt: skip
    answer = httpx.post(f"{url}/v1/records", json=body, headers=headers)
    assert answer.status_code == 201, answer.text
    return answer


def served(url: str) -> dict[str, object] | None:
    with Client(url) as client:
        return client.lookup(make_key(m=64), default=DEFAULT).config


def reject(verifier: Client, worker: str, record_id: int) -> None:
    task = verifier.claim_verification(worker, device_arch=CPU.arch, backends=["tvm"])
    assert task is not None and task.record.id == record_id
    failed = VerificationCreate(worker=worker, outcome="failed", device_name="verifier-cpu",
                                validation=make_record(passed=False).validation)  # fmt: skip
    assert verifier.submit_verification(record_id, failed).status == "rejected"


def passed(worker: str) -> VerificationCreate:
    return VerificationCreate(worker=worker, outcome="passed", device_name="verifier-cpu",
                              timing=make_record(time_ms=1.1).timing,
                              validation=make_record().validation)  # fmt: skip


def test_a_dispute_and_a_rejection_hold_for_every_copy_of_the_config(server: LiveServer) -> None:
    url = server.url
    writer = {"Authorization": f"Bearer {token(url, 'hostile', 'write')}"}
    first = upload(url, BAD, 1.0, writer).json()["record_id"]
    copy = upload(url, BAD, 1.2, writer).json()["record_id"]  # a copy held in reserve
    # Verified at once (a trusted token's): no verifier's turn for it before the hostile ones.
    trusted = {"Authorization": f"Bearer {token(url, 'ci', 'write', trusted=True)}"}
    upload(url, GOOD, 3.0, trusted)
    reader = {"Authorization": f"Bearer {token(url, 'consumer', 'read')}"}
    disputed_at = {"M": 50, "N": 64, "K": 64}  # in the record's bucket (M 33..64)
    body = dispute_body(make_key(m=64), disputed_at)
    assert post_dispute(url, first, reader, body).json()["status"] == "disputed"
    assert served(url) == GOOD  # not the copy
    reordered = {k: BAD[k] for k in reversed(BAD)}  # the same config, other bytes
    again = upload(url, reordered, 0.5, writer).json()
    assert (again["status"], again["is_winner"]) == ("disputed", False)
    assert served(url) == GOOD

    with Client(url, token=token(url, "v", "verify")) as verifier:
        reject(verifier, "w", first)
        twin = verifier.claim_verification("w2", device_arch=CPU.arch, backends=["tvm"])
        assert twin is not None and twin.record.id == copy
        assert twin.disputed_problems == [disputed_at]  # the copy is checked where it failed
        assert verifier.get_record(copy).status == "disputed"  # a question, not a verdict
    late = upload(url, BAD, 0.1, writer).json()
    assert (late["status"], late["is_winner"]) == ("disputed", False)
    assert upload(url, BAD, 0.1, trusted).json()["status"] == "disputed"  # a verifier's verdict
    assert served(url) == GOOD


def test_a_verifier_passes_a_config_only_after_every_dispute_of_its_copies(
    server: LiveServer,
) -> None:
    """A copy disputed while the verifier checks another (its lease held) keeps both out of
    service: the pass did not run that dispute. The next check runs it, and the pass then
    gives the copies their standing back; a new upload of the config is pending again."""
    url = server.url
    first = upload(url, BAD, 1.0, AUTH).json()["record_id"]
    copy = upload(url, BAD, 1.5, AUTH).json()["record_id"]
    reader = {"Authorization": f"Bearer {token(url, 'consumer', 'read')}"}
    assert post_dispute(url, first, reader, dispute_body(make_key(m=64))).status_code == 200
    with Client(url, token=token(url, "v", "verify")) as verifier:
        task = verifier.claim_verification("w", device_arch=CPU.arch, backends=["tvm"])
        assert task is not None and task.record.id == first
        assert task.disputed_problems == [dict(make_key(m=64).problem)]
        late = {"M": 50, "N": 64, "K": 64}
        assert (
            post_dispute(url, copy, reader, dispute_body(make_key(m=64), late)).status_code == 200
        )
        assert verifier.submit_verification(first, passed("w")).status == "disputed"
        assert served(url) == DEFAULT
        task = verifier.claim_verification("w", device_arch=CPU.arch, backends=["tvm"])
        assert task is not None and task.record.id == first
        assert task.disputed_problems == [late]  # the copy's dispute, run now
        assert verifier.submit_verification(first, passed("w")).status == "verified"
        assert verifier.get_record(copy).status == "pending"
    assert served(url) == BAD
    assert upload(url, BAD, 0.9, AUTH).json()["status"] == "pending"


def test_a_rejection_is_a_verdict_on_one_record_and_a_new_upload_is_checked_again(
    server: LiveServer,
) -> None:
    """A rejection (a timeout, say) does not ban the config at its key for good: a new upload
    of it is disputed, and a verifier that passes it restores it."""
    url = server.url
    first = upload(url, BAD, 1.0, AUTH).json()["record_id"]
    with Client(url, token=token(url, "v", "verify")) as verifier:
        reject(verifier, "w", first)
        again = upload(url, BAD, 1.0, AUTH).json()
        assert (again["status"], served(url)) == ("disputed", DEFAULT)
        task = verifier.claim_verification("w", device_arch=CPU.arch, backends=["tvm"])
        assert task is not None and task.record.id == again["record_id"]
        assert verifier.submit_verification(again["record_id"], passed("w")).status == "verified"
    assert served(url) == BAD
    assert upload(url, BAD, 2.0, AUTH).json()["status"] == "pending"


def test_only_a_validated_record_of_the_very_same_config_is_a_copy(server: LiveServer) -> None:
    """A hostile token cannot take an honest config out of service with a near copy: ``1`` for
    ``True`` is another config (the closed schemas and the spaces tell them apart), and an
    unvalidated copy (never served, never verified) carries no finding."""
    url = server.url
    honest = knobs(1, vectorize=True)
    trusted = {"Authorization": f"Bearer {token(url, 'ci', 'write', trusted=True)}"}
    kept = upload(url, honest, 1.0, trusted).json()
    assert kept["status"] == "verified" and kept["is_winner"]
    writer = {"Authorization": f"Bearer {token(url, 'hostile', 'write')}"}
    near = upload(url, knobs(1, vectorize=1), 0.5, writer).json()["record_id"]
    body = make_record(make_key(m=64), config=honest, passed=False).model_dump(
        mode="json", by_alias=True)  # fmt: skip
    failing = httpx.post(f"{url}/v1/records", json=body, headers=writer).json()["record_id"]
    reader = {"Authorization": f"Bearer {token(url, 'consumer', 'read')}"}
    for record_id in (near, failing):
        assert post_dispute(url, record_id, reader, dispute_body(make_key(m=64))).status_code == 200
    with Client(url) as client:
        assert client.get_record(kept["record_id"]).status == "verified"
    assert served(url) == honest
    assert upload(url, honest, 0.9, trusted).json()["status"] == "verified"


def test_findings_on_twins_at_once_all_land(any_server: LiveServer) -> None:
    """Disputes of six copies of one config and new uploads of it, all at once, on either
    database: each is answered, and none of the copies is served after (a copy uploaded in the
    instant a dispute lands is disputed with the others: each takes the key's lock)."""
    url = any_server.url
    ids = [upload(url, BAD, 1.0 + i / 10, AUTH).json()["record_id"] for i in range(6)]
    upload(url, GOOD, 3.0, AUTH)
    readers = [{"Authorization": f"Bearer {token(url, f'consumer{i}', 'read')}"} for i in range(6)]
    body = dispute_body(make_key(m=64))

    def dispute(i: int) -> int:
        return post_dispute(url, ids[i], readers[i], body).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        disputes = [pool.submit(dispute, i) for i in range(6)]
        uploads = [pool.submit(upload, url, BAD, 0.5 + i / 10, AUTH) for i in range(4)]
    assert [f.result() for f in disputes] == [200] * 6
    assert all(f.result().status_code == 201 for f in uploads)
    with Client(url) as client:
        listed = client.list_records(key_hash=make_key(m=64).digest(), limit=100).items
    assert {r.status for r in listed if r.config == BAD} == {"disputed"}
    assert served(url) == GOOD


def test_a_copy_uploaded_while_a_dispute_lands_is_disputed_with_the_others(
    any_server: LiveServer,
) -> None:
    """An upload of the config still open (stored, not committed) when a dispute of it arrives:
    the dispute waits for the key's lock, then finds the copy. Without the lock it read the
    key's records before the copy was committed and left it served."""
    import threading
    import time

    from cache_server.db import make_engine, make_sessionmaker
    from cache_server.queries import add_record

    url = any_server.url
    first = upload(url, BAD, 1.0, AUTH).json()["record_id"]
    upload(url, GOOD, 3.0, AUTH)
    reader = {"Authorization": f"Bearer {token(url, 'consumer', 'read')}"}
    # the token's first use writes its last use (SQLite: the write lock); not the dispute's
    assert httpx.get(f"{url}/v1/records", headers=reader).status_code == 200
    answers: list[int] = []
    disputing = threading.Thread(target=lambda: answers.append(
        post_dispute(url, first, reader, dispute_body(make_key(m=64))).status_code))  # fmt: skip
    engine = make_engine(any_server.db)
    try:
        with make_sessionmaker(engine).begin() as session:
            record = make_record(make_key(m=64), time_ms=0.5, config=BAD)
            copy = add_record(session, key_hash=make_key(m=64).digest(), record=record)
            disputing.start()
            time.sleep(1.0)  # the dispute reaches the server meanwhile
    finally:
        engine.dispose()
    disputing.join(timeout=60)
    assert answers == [200]
    with Client(url) as client:
        assert client.get_record(copy.record_id).status == "disputed"
    assert served(url) == GOOD


def test_records_ls_lists_a_keys_records_by_status(server: LiveServer) -> None:
    """What an operator reads after findings: `records ls --status rejected` lists the records
    a verifier rejected, `--status disputed` those out of service until checked (its copies)."""
    import subprocess
    import sys

    url = server.url
    first = upload(url, BAD, 1.0, AUTH).json()["record_id"]
    copy = upload(url, BAD, 1.2, AUTH).json()["record_id"]
    upload(url, GOOD, 3.0, AUTH)
    with Client(url, token=token(url, "v", "verify")) as verifier:
        reject(verifier, "w", first)
    for status, record_id in (("rejected", first), ("disputed", copy)):  # --all implied
        listed = subprocess.run([sys.executable, "-m", "tunecache_cli", "records", "ls",
                                 "--status", status, "--server", url],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        rows = [line for line in listed.stdout.splitlines() if line.startswith("#")]
        assert len(rows) == 1 and rows[0].startswith(f"#{record_id} "), listed.stdout
        assert f" {status} " in rows[0]
    bad = subprocess.run([sys.executable, "-m", "tunecache_cli", "records", "ls", "--status",
                          "gone", "--server", url], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "--status" in bad.stderr and "Traceback" not in bad.stderr


def test_tune_says_an_upload_of_a_disputed_config_is_not_served() -> None:
    """`tunecache tune`'s last line, for an upload stored disputed (no winner at its key): it
    said "kept; #None is faster"."""
    from tunecache.schemas import UploadResult
    from tunecache_cli.tune import upload_state

    held = UploadResult(record_id=3, key_hash="0" * 64, winner_record_id=None, is_winner=False,
                        status="disputed")  # fmt: skip
    assert upload_state(held).startswith("disputed, not served: ") and "None" not in upload_state(
        held
    )
    won = held.model_copy(update={"status": "pending", "is_winner": True, "winner_record_id": 3})
    assert upload_state(won) == "the winner"
    kept = held.model_copy(update={"status": "pending", "winner_record_id": 2})
    assert upload_state(kept) == "kept; #2 stays the winner (a lower time)"  # not "is faster"


def test_a_copy_that_spells_out_a_default_of_the_space_is_a_copy(server: LiveServer) -> None:
    """A built-in kernel's config may leave out a parameter its space defaults (matmul's Triton
    ``SPLIT_K``, 1): the same config with it written out runs the same and is the same config."""
    from tests.factories import default_config

    url = server.url
    key = make_key(m=64, kernel="matmul", backend="triton", dtype="float16")
    short = default_config(key)
    assert "SPLIT_K" not in short

    def send(config: dict[str, object], ms: float) -> dict[str, object]:
        body = make_record(key, time_ms=ms, config=config).model_dump(mode="json", by_alias=True)
        answer = httpx.post(f"{url}/v1/records", json=body, headers=AUTH)
        assert answer.status_code == 201, answer.text
        stored: dict[str, object] = answer.json()
        return stored

    first = send(short, 1.0)["record_id"]
    reader = {"Authorization": f"Bearer {token(url, 'consumer', 'read')}"}
    assert post_dispute(url, first, reader, dispute_body(key)).status_code == 200
    assert send({**short, "SPLIT_K": 1}, 0.5)["status"] == "disputed"
    assert send({**short, "SPLIT_K": 2}, 0.5)["status"] == "pending"  # another config


def test_a_verification_runs_at_most_sixteen_disputed_problems_and_the_rest_wait(
    server: LiveServer,
) -> None:
    """Copies disputed 32 times each at distinct problems of the bucket made a verifier's task of
    thousands of problems, one validation each (hours). A task lists the oldest 16, each once; a
    pass settles the disputes at those, and the record stays disputed until a verifier has run
    the rest."""
    from cache_server.trust import MAX_TASK_PROBLEMS

    url = server.url
    first = upload(url, BAD, 1.0, AUTH).json()["record_id"]
    copy = upload(url, BAD, 1.2, AUTH).json()["record_id"]
    key = make_key(m=64)
    problems = [{"M": m, "N": 64, "K": 64} for m in range(34, 34 + MAX_TASK_PROBLEMS + 4)]
    # A reader's open dispute of a record counts once: one reader a problem, half on each copy.
    readers = [{"Authorization": f"Bearer {token(url, f'reader{i}', 'read')}"}
               for i in range(len(problems))]  # fmt: skip
    for i, problem in enumerate(problems):
        target = first if i % 2 == 0 else copy
        assert post_dispute(url, target, readers[i], dispute_body(key, problem)).status_code == 200
    # The first problem again, by another reader of the other copy: listed once.
    assert post_dispute(url, copy, readers[0], dispute_body(key, problems[0])).status_code == 200
    with Client(url, token=token(url, "verifier", "verify")) as verifier:
        task = verifier.claim_verification("v1", device_arch=CPU.arch, backends=["tvm"])
        assert task is not None
        assert [dict(p) for p in task.disputed_problems] == problems[:MAX_TASK_PROBLEMS]
        # Its finding answers the first ten: the other six it was given wait, with the rest.
        answered = passed("v1").model_copy(update={"disputed_problems": problems[:10]})
        verifier.submit_verification(task.record.id, answered)
        listed = verifier.list_records(key_hash=key.digest(), limit=100).items
        assert {r.status for r in listed} == {"disputed"}
        rest = verifier.claim_verification("v2", device_arch=CPU.arch, backends=["tvm"])
        assert rest is not None
        assert [dict(p) for p in rest.disputed_problems] == problems[10:]
        # An older verifier's finding says nothing: those its task listed are settled.
        assert verifier.submit_verification(rest.record.id, passed("v2")).status == "verified"
    assert served(url) == BAD  # every dispute was run, and passed


def test_a_claim_reads_a_disputed_problem_stored_before_its_text_was_checked(
    server: LiveServer,
) -> None:
    """A problem's string stored before control characters were refused (a 201 then) made the
    task refuse it: a 500 on every claim of the record, which disputed ones lead, for good."""
    import json
    import sqlite3

    url = server.url
    record_id = upload(url, BAD, 1.0, AUTH).json()["record_id"]
    reader = {"Authorization": f"Bearer {token(url, 'consumer', 'read')}"}
    at = {"M": 50, "N": 64, "K": 64}
    assert post_dispute(url, record_id, reader, dispute_body(make_key(m=64), at)).status_code == 200
    assert server.db_path is not None
    with sqlite3.connect(server.db_path) as db:  # as an older server stored it
        db.execute("UPDATE disputes SET problem = ?", (json.dumps({**at, "mode": "\x1b]0;x\x07"}),))
    with Client(url, token=token(url, "verifier", "verify")) as verifier:
        task = verifier.claim_verification("v1", device_arch=CPU.arch, backends=["tvm"])
        assert task is not None and task.record.id == record_id
        assert [dict(p)["mode"] for p in task.disputed_problems] == ["\x1b]0;x\x07"]


def test_a_verifier_takes_at_most_its_share_of_a_tasks_problems() -> None:
    """A hostile server listed one problem 400 times: 401 validations of one record (70 s at
    16×16×16; hours at real sizes). A verifier takes the first MAX_DISPUTED_PROBLEMS (its
    finding answers those: the rest stay open) and runs each once (Verifier._servable)."""
    from tunecache.verification import MAX_DISPUTED_PROBLEMS, VerifyTask

    record = make_record(make_key(m=64)).model_dump(mode="json", by_alias=True)
    task = {"record": {**record, "id": 7, "key_hash": "0" * 64,
                       "created_at": "2026-01-01T00:00:00Z"},
            "lease_expires_at": "2026-01-01T00:10:00Z"}  # fmt: skip
    problem = {"M": 40, "N": 64, "K": 64}
    assert len(VerifyTask.model_validate({**task, "disputed_problems": [problem] * 3})
               .disputed_problems) == 3  # fmt: skip
    many = [{**problem, "M": 33 + i % 32} for i in range(400)]
    taken = VerifyTask.model_validate({**task, "disputed_problems": many}).disputed_problems
    assert [dict(p) for p in taken] == many[:MAX_DISPUTED_PROBLEMS]


def test_a_config_disputed_at_a_key_is_served_there_by_no_other_rule(server: LiveServer) -> None:
    """A dispute is about a config at a key: its copy under another device's name of the same
    arch (a look-alike name, ``tеst-cpu``), or at a bucket mate's shape, was served at the
    disputed key by the same-arch or bucket rule the moment the dispute took the first out."""
    import dataclasses

    url = server.url
    key = make_key(m=64)
    elsewhere = dataclasses.replace(key, device=dataclasses.replace(CPU, name="t\u0435st-cpu"))
    writer = {"Authorization": f"Bearer {token(url, 'hostile', 'write')}"}
    first = upload(url, BAD, 1.0, writer).json()["record_id"]
    for copy in (make_record(elsewhere, time_ms=1.5, config=BAD),
                 make_record(make_key(m=60), time_ms=1.5, config=BAD)):  # fmt: skip
        body = copy.model_dump(mode="json", by_alias=True)
        assert httpx.post(f"{url}/v1/records", json=body, headers=writer).status_code == 201
    reader = {"Authorization": f"Bearer {token(url, 'consumer', 'read')}"}
    assert post_dispute(url, first, reader, dispute_body(key)).json()["status"] == "disputed"
    with Client(url) as client:
        assert client.lookup(key, default=DEFAULT).source == "default"
        assert client.lookup(make_key(m=60), default=DEFAULT).config == BAD  # not disputed there
    third = dataclasses.replace(key, device=dataclasses.replace(CPU, name="third-cpu"))
    good = make_record(third, time_ms=2.0, config=GOOD).model_dump(mode="json", by_alias=True)
    assert httpx.post(f"{url}/v1/records", json=good, headers=AUTH).status_code == 201
    with Client(url) as client:
        found = client.lookup(key, default=DEFAULT)
    assert (found.config, found.source) == (GOOD, "server")  # another config is served
