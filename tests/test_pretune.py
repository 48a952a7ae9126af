"""Pre-tune manifests, coverage and two daemons sharing the queue, against a real server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tunecache.errors import InvalidInput
from tunecache.manifest import parse_manifest
from tunecache.presets import preset_problems

REPO = Path(__file__).resolve().parent.parent
EIGHT_KEYS = """
policy = "compatible"

[[tune]]
kernel = "matmul"
backends = ["tvm", "inductor"]
shapes = [{M = 8, N = 16, K = 16}, {M = 12, N = 16, K = 16}, {M = 24, N = 16, K = 16},
          {M = 40, N = 16, K = 16}]
trials = 2
"""


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "tunecache_cli", *args], capture_output=True,
                          text=True, timeout=900, cwd=REPO, env=env or dict(os.environ))  # fmt: skip


def test_presets_give_the_models_gemms_and_norms() -> None:
    llama = preset_problems("llama3-8b", tokens=[16], tp=2)
    assert llama["matmul"] == [{"M": 16, "N": 3072, "K": 4096}, {"M": 16, "N": 4096, "K": 2048},
                               {"M": 16, "N": 14336, "K": 4096}, {"M": 16, "N": 4096, "K": 7168}]  # fmt: skip
    assert llama["rmsnorm"] == [{"M": 16, "N": 4096}]
    mixtral = preset_problems("mixtral-8x7b", tokens=[64])["matmul"]
    assert {"M": 16, "N": 28672, "K": 4096} in mixtral  # 64 tokens x top-2 of 8 experts: 16 each
    assert len(preset_problems("llama3-70b", tokens=[1, 2048])["matmul"]) == 8


BAD = [
    ('[[tune]]\nkernel = "conv9d"\nbackends = ["tvm"]\nshapes = [{M = 8}]\n', "the [[tune]] entry at line 1: unknown kernel 'conv9d'"),
    # an entry's header with a comment, or spaced, is an entry's line too
    ('[[tune]] # first\nkernel = "matmul"\nbackends = ["tvm"]\nshapes = [{M = 8, N = 8, K = 8}]\n[[ tune ]]\nkernel = "softmax"\nbackends = ["tvm"]\nshapes = [{M = -1, N = 8}]\n', "the [[tune]] entry at line 5: problem: M=-1 is outside"),
    ('[[tune]]  # the bad one\nkernel = "matmul"\nbackends = ["tvm"]\nshapes = [{M = 8, N = 8, Q = 8}]\n[[tune]]\nkernel = "softmax"\nbackends = ["tvm"]\nshapes = [{M = 1, N = 8}]\n', "the [[tune]] entry at line 1: matmul takes"),
    ('[[tune]]\nkernel = "matmul"\nbackends = ["tmv"]\nshapes = [{M = 8, N = 8, K = 8}]\n', "unknown backend 'tmv' (did you mean 'tvm'?)"),
    # a top-level typo left the default policy quietly
    ('polcy = "strict"\n[[tune]]\nkernel = "matmul"\nbackends = ["tvm"]\nshapes = [{M = 8, N = 8, K = 8}]\n', "unknown top-level fields ['polcy'] (did you mean policy?)"),
    ('\n\n[[tune]]\npreset = "gpt-9"\nbackends = ["tvm"]\n', "line 3: unknown preset 'gpt-9'"),
    ('[[tune]]\nkernel = "matmul"\nbackends = ["tvm"]\nshapes = [{M = 8, N = 8}]\n', "line 1: matmul takes shape parameters M, N, K: missing K"),
    ('[[tune]]\nkernel = "matmul"\nshapes = [{M = 8, N = 8, K = 8}]\n', "line 1: backends must be a non-empty list"),
    ('[[tune]]\nkernel = "matmul"\nbackends = ["tvm"]\nshapes = [{M = 8, N = 8, K = 8}]\ntrials = 0\n', "line 1: trials=0 must be an integer from 1 to"),
    ('[[tune]]\nkernel = "matmul"\nbackends = ["tvm"]\nshapes = [{M = 8, N = 8, K = 8}]\nbudget = 3\n', "line 1: unknown fields ['budget']"),
    ('[[tune]]\nkernel = "matmul"\nbackends = ["tvm"]\nshape = [{M = 8, N = 8, K = 8}]\n', "unknown fields ['shape'] (did you mean 'shapes'?); known:"),
    ('[[tune]]\nkernel = "matmul"\nbackends = ["tvm"]\nshapes = [{M = 8, N = 8, K = 8}]\n[[tune]]\nkernel = "softmax"\nbackends = ["tvm"]\nshapes = [{M = -1, N = 8}]\n', "line 5: problem: M=-1 is outside"),
    ('arch = "sm_999"\n[[tune]]\nkernel = "matmul"\nbackends = ["triton"]\nshapes = [{M = 8, N = 8, K = 8}]\n', "arch 'sm_999' is not a known arch; known: sm_50"),
    ('[[tune]]\nkernel = "matmul"\nbackends = ["tvm"]\nshapes = [{M = 8, N = 8, K = 8}]\ntrials = 2_000_000\n', "line 1: trials=2000000 must be an integer from 1 to 1,000,000"),
    ('[[tune]]\nkernel = "matmul"\nbackends = ["tvm"]\nshapes = [{M = 8, N = 8, K = 8}]\nstrategy = "Optuna"\n', "line 1: strategy='Optuna' is not a strategy name"),
    ("kernel = [", "not TOML"),
    # Not a table: an internal error (a number), the letters of a string read as its parameters.
    ('[[tune]]\nkernel = "matmul"\nbackends = ["tvm"]\nshapes = [8]\n', "line 1: shapes[0] = 8 is not a table of sizes"),
    ('[[tune]]\nkernel = "matmul"\nbackends = ["tvm"]\nshapes = ["M=8,N=8,K=8"]\n', "shapes[0] = 'M=8,N=8,K=8' is not a table"),
    ('[[tune]]\nkernel = "matmul"\nbackends = ["tvm"]\nshapes = [{M = 8, N = 8, K = 8}, true]\n', "shapes[1] = True is not a table"),
    ("policy = 'loose'\n[[tune]]\n", "policy 'loose'"),
]  # fmt: skip


def test_a_manifests_arch_applies_to_the_backends_that_run_on_it() -> None:
    """``arch = "sm_90"`` beside TVM and Inductor entries made GPU keys for CPU backends: jobs
    no daemon would ever claim."""
    from tunecache.device import local_device

    manifest = parse_manifest('arch = "sm_90"\n[[tune]]\nkernel = "matmul"\n'
                              'backends = ["triton", "tvm", "inductor"]\n'
                              "shapes = [{M = 8, N = 8, K = 8}]\n")  # fmt: skip
    devices = {key.backend: key.device for key in manifest.keys}
    assert (devices["triton"].kind, devices["triton"].arch) == ("cuda", "sm_90")
    assert devices["tvm"] == devices["inductor"] == local_device("cpu").fingerprint


@pytest.mark.parametrize(("text", "message"), BAD)
def test_a_bad_manifest_names_its_line(text: str, message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_manifest(text)
    assert message in str(raised.value)


def test_a_bad_manifest_or_no_token_queues_nothing(server: LiveServer, tmp_path: Path) -> None:
    import os

    bad = tmp_path / "bad.toml"
    bad.write_text(next(text for text, message in BAD if "line 5:" in message))
    done = cli("pretune", str(bad), "--server", server.url, "--no-wait")
    assert done.returncode == 2 and "line 5" in done.stderr
    good = tmp_path / "good.toml"
    good.write_text(EIGHT_KEYS)
    env = {k: v for k, v in os.environ.items() if k != "TUNECACHE_TOKEN"}
    done = cli("pretune", str(good), "--server", server.url, "--no-wait", env=env)
    assert done.returncode == 2 and "'write' scope" in done.stderr
    assert httpx.get(f"{server.url}/v1/jobs").json()["count"] == 0


def test_coverage_and_pretune_json_are_json_only(server: LiveServer, tmp_path: Path) -> None:
    manifest = tmp_path / "eight.toml"
    manifest.write_text(EIGHT_KEYS)
    done = cli("coverage", str(manifest), "--server", server.url, "--json")
    assert done.returncode == 1  # nothing tuned yet
    document = json.loads(done.stdout)  # one document (it was a line per key)
    rows = document["keys"]
    assert len(rows) == 8 and {r["state"] for r in rows} == {"missing"}
    assert document["totals"] == {"tuned": 0, "stale": 0, "queued": 0, "failed": 0, "missing": 8}
    assert "8 missing of 8 keys" in done.stderr
    queued = cli("pretune", str(manifest), "--server", server.url, "--no-wait", "--json")
    assert queued.returncode == 0, queued.stderr
    jobs = json.loads(queued.stdout)  # JSON only: "8 keys: 0 tuned already" went to stderr
    assert (jobs["keys"], jobs["tuned_already"], len(jobs["jobs"])) == (8, 0, 8)
    assert {j["state"] for j in jobs["jobs"]} == {"queued"} and "8 queued" in queued.stderr


@pytest.mark.slow
def test_two_daemons_tune_every_key_of_a_manifest_exactly_once(
    server: LiveServer, tmp_path: Path
) -> None:
    manifest = tmp_path / "eight.toml"
    manifest.write_text(EIGHT_KEYS)
    before = cli("coverage", str(manifest), "--server", server.url)
    assert before.returncode == 1 and "8 missing of 8 keys" in before.stdout
    queued = cli("pretune", str(manifest), "--server", server.url, "--no-wait")
    assert queued.returncode == 0 and "8 queued" in queued.stderr, queued.stderr
    daemons = [
        subprocess.Popen([sys.executable, "-m", "tunecache_cli", "daemon", "--once", "--server",
                          server.url, "--trials", "2", "--workers", "1"], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    reports = [d.communicate(timeout=900)[1] for d in daemons]
    assert all(d.returncode == 0 for d in daemons), reports
    jobs = httpx.get(f"{server.url}/v1/jobs").json()["items"]
    assert len(jobs) == 8 and all(j["state"] == "done" and j["attempts"] == 1 for j in jobs)
    assert all(j["trials"] == 2 for j in jobs)  # the manifest's budget travels with the job
    owners = {j["lease_owner"] for j in jobs}
    records = httpx.get(f"{server.url}/v1/records", params={"limit": 100}).json()["items"]
    assert len(records) == 8 and all(r["validation"]["passed"] for r in records)  # once each
    assert {j["record_id"] for j in jobs} == {r["id"] for r in records}
    after = cli("coverage", str(manifest), "--server", server.url)
    assert after.returncode == 0 and "8 tuned" in after.stdout, after.stdout
    again = cli("pretune", str(manifest), "--server", server.url)
    assert again.returncode == 0 and "8 tuned already, 0 queued" in again.stderr
    assert len(owners) >= 1


@pytest.mark.slow
def test_ray_tasks_tune_every_key_of_a_manifest_once(server: LiveServer, tmp_path: Path) -> None:
    """Ray tasks are daemons: each key tuned once, its record validated and found by
    ``coverage`` as the manifest's key (what the two daemons above are held to)."""
    pytest.importorskip("ray")
    manifest = tmp_path / "four.toml"
    manifest.write_text(
        EIGHT_KEYS.replace(", {M = 24, N = 16, K = 16},\n          {M = 40, N = 16, K = 16}", "")
    )
    on_ray = cli("pretune", str(manifest), "--server", server.url, "--ray", "--trials", "2")
    assert on_ray.returncode == 0 and "ray tasks stored 4 records" in on_ray.stderr, on_ray.stderr
    records = httpx.get(f"{server.url}/v1/records", params={"limit": 100}).json()["items"]
    keys = {(r["key"]["backend"], r["key"]["problem"]["M"]) for r in records}
    assert len(records) == 4 and keys == {(b, m) for b in ("tvm", "inductor") for m in (8, 12)}
    assert all(r["validation"]["passed"] for r in records)
    jobs = httpx.get(f"{server.url}/v1/jobs").json()["items"]
    assert len(jobs) == 4 and all(j["state"] == "done" and j["attempts"] == 1 for j in jobs)
    assert {j["record_id"] for j in jobs} == {r["id"] for r in records}  # once each
    covered = cli("coverage", str(manifest), "--server", server.url)
    assert covered.returncode == 0 and "4 tuned" in covered.stdout, covered.stdout


@pytest.mark.slow
def test_pretune_local_tunes_its_manifests_keys_and_no_one_elses(
    server: LiveServer, tmp_path: Path
) -> None:
    """A job someone else queued (most urgent, a million trials) is left to its own workers:
    ``pretune --local`` claimed it first and tuned it at its budget, for up to an hour."""
    from tunecache.client import Client
    from tunecache.key import key_for

    foreign = key_for("matmul", "tvm", {"M": 64, "N": 64, "K": 64}, "float32")
    with Client(server.url) as client:  # the tests' token (TUNECACHE_TOKEN)
        job = client.create_job(foreign, priority=1000, trials=1_000_000).job
    manifest = tmp_path / "one.toml"
    manifest.write_text('[[tune]]\nkernel = "softmax"\nbackends = ["tvm"]\n'
                        "shapes = [{M = 8, N = 8}]\ntrials = 1\n")  # fmt: skip
    done = cli("pretune", str(manifest), "--server", server.url, "--local", "--trials", "1")
    assert done.returncode == 0 and "1 queued" in done.stderr, done.stderr
    jobs = {j["id"]: j for j in httpx.get(f"{server.url}/v1/jobs").json()["items"]}
    assert (jobs[job.id]["state"], jobs[job.id]["attempts"]) == ("queued", 0)
    (mine,) = (j for j in jobs.values() if j["id"] != job.id)
    assert mine["state"] == "done" and mine["key"]["kernel"] == "softmax"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('backends = ["tvm"]\nstrategy = "nosuch"', "unknown strategy 'nosuch' for tvm"),
        ('backends = ["inductor"]\nstrategy = "bayes"', "inductor has no space to search"),
    ],
    ids=["unknown", "no-space"],
)
def test_a_strategy_that_cannot_tune_its_backend_queues_nothing(
    server: LiveServer, tmp_path: Path, entry: str, message: str
) -> None:
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(f'[[tune]]\nkernel = "matmul"\n{entry}\nshapes = [{{M = 8, N = 8, K = 8}}]\n'
                        '\n[[tune]]\nkernel = "softmax"\nbackends = ["tvm"]\n'
                        "shapes = [{M = 8, N = 8}]\n")  # fmt: skip
    done = cli("pretune", str(manifest), "--server", server.url, "--no-wait")
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "nothing queued" in done.stderr
    assert httpx.get(f"{server.url}/v1/jobs").json()["count"] == 0  # not even the good entry


def test_local_tuning_waits_for_a_failed_jobs_retry_instead_of_stopping(tmp_path: Path) -> None:
    """A once-daemon stops when nothing is claimable; a job that failed waits for its retry,
    so ``pretune --local`` runs its daemons again when it is due (it hung in follow())."""
    from tests.conftest import start_server
    from tests.factories import make_key
    from tunecache.client import Client
    from tunecache_cli.pretune import _until_no_retry

    db = tmp_path / "cache.db"
    live = start_server(f"sqlite:///{db}", db, tmp_path / "server.log",
                        env={"TUNECACHE_SERVER_RETRY_SECONDS": "1"})  # fmt: skip
    try:
        with Client(live.url) as client:
            job = client.create_job(make_key(8), max_attempts=3).job
            claimed = client.claim_job("w", lease_seconds=60)
            assert claimed is not None
            client.fail_job(claimed.id, "w", "flaky")
            drains: list[str] = []

            def drain() -> None:  # a once-daemon: takes what is claimable now, then stops
                taken = client.claim_job("w", lease_seconds=60)
                drains.append("took" if taken else "nothing")
                if taken is not None:
                    client.fail_job(taken.id, "w", "flaky again")

            _until_no_retry(client, [job.key_hash], drain)
            assert drains[0] == "nothing"  # the first retry was not due yet: it waited
            assert drains.count("took") == 2  # attempts 2 and 3, each when due
            (final,) = client.list_jobs().items
            assert final.state == "failed" and final.attempts == 3
    finally:
        live.stop()


def test_follow_says_once_how_to_start_a_worker_when_none_has_claimed_a_job(
    server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pretune`` with no daemon printed "0/1 done, 0 running, 0 failed" every 2 s forever.
    Now, when no job was claimed ``hint_after`` seconds in, one line says what to start, once;
    and it keeps following: the daemon that comes later finishes it."""
    import threading
    import time

    from tests.factories import make_key
    from tunecache.client import Client
    from tunecache_cli.pretune import follow

    def late_daemon() -> None:
        time.sleep(1.5)  # well after the hint
        with Client(server.url) as worker:
            claimed = worker.claim_job("late", lease_seconds=60)
            assert claimed is not None
            worker.fail_job(claimed.id, "late", "gave up")

    with Client(server.url) as client:
        job = client.create_job(make_key(8), max_attempts=1).job
        thread = threading.Thread(target=late_daemon)
        thread.start()
        failed = follow(client, [job.key_hash], poll=0.1, hint="HINT start a daemon",
                        hint_after=0.5)  # fmt: skip
        thread.join()
    assert failed == 1  # it waited for the daemon: the hint did not stop it
    lines = capsys.readouterr().err.splitlines()
    assert lines.count("HINT start a daemon") == 1, lines
    at = lines.index("HINT start a daemon")
    assert 0 < at < len(lines) - 1 and "0/1 done, 0 running, 0 failed" in lines[0]
    assert "0/1 done, 0 running, 1 failed" in lines[-1]


def test_the_hint_names_the_daemon_each_device_of_the_jobs_needs() -> None:
    from tunecache_cli.pretune import unclaimed_hint

    manifest = parse_manifest('arch = "sm_90"\n[[tune]]\nkernel = "matmul"\n'
                              'backends = ["triton", "tvm"]\n'
                              "shapes = [{M = 8, N = 8, K = 8}]\n")  # fmt: skip
    (tvm,) = [k for k in manifest.keys if k.backend == "tvm"]
    assert unclaimed_hint(manifest, [tvm.digest()]) == (
        "no worker has claimed any of these jobs yet: start one with `tunecache daemon --device "
        f"cpu` on a machine of arch {tvm.device.arch}, with the kernels' sources as here (a "
        "daemon running another version of a kernel leaves its jobs); waiting (Ctrl-C stops "
        "waiting, the jobs stay queued)"
    )
    both = unclaimed_hint(manifest, [k.digest() for k in manifest.keys])
    assert f"`tunecache daemon --device cpu` on a machine of arch {tvm.device.arch} and " \
        "`tunecache daemon --device cuda` on a machine of arch sm_90, with" in both  # fmt: skip


def test_a_job_listing_that_never_ends_is_read_a_bounded_number_of_pages() -> None:
    """A hostile server answering each page with one job (the same one, or a new one) and a
    count of a billion kept ``pretune`` and ``coverage`` asking for ever: now the listing stops
    when a page brings nothing new, and after :data:`MAX_JOB_PAGES` pages in any case."""
    from datetime import UTC, datetime

    from tests.factories import make_key
    from tunecache import Client
    from tunecache.http import IDENTITY_HEADER
    from tunecache_cli.job_reads import MAX_JOB_PAGES, all_jobs

    asked: list[int] = []

    def job(n: int) -> dict[str, object]:
        now = datetime.now(UTC).isoformat()
        return {"id": n, "key_hash": f"{n:064x}", "key": make_key(m=64).to_json(),
                "state": "queued", "priority": 0, "source": "api", "attempts": 0,
                "max_attempts": 3, "lease_owner": None, "lease_expires_at": None, "error": "",
                "record_id": None, "created_at": now, "updated_at": now}  # fmt: skip

    def answer(fresh: bool) -> httpx.MockTransport:
        def handle(request: httpx.Request) -> httpx.Response:
            asked.append(1)
            n = len(asked) if fresh else 1
            return httpx.Response(200, json={"items": [job(n)], "count": 10**9},
                                  headers={IDENTITY_HEADER: "tunecache/0"})  # fmt: skip

        return httpx.MockTransport(handle)

    with Client("http://cache.test", transport=answer(fresh=False), token="") as client:
        assert len(all_jobs(client)) == 1 and len(asked) == 2
    asked.clear()
    with Client("http://cache.test", transport=answer(fresh=True), token="") as client:
        assert len(all_jobs(client)) == MAX_JOB_PAGES == len(asked)


def test_coverage_and_pretune_count_as_tuned_only_what_a_process_would_use() -> None:
    """A server answering every lookup with a record of another problem (or a rejected one, or
    one that failed validation) had ``coverage`` say "2 tuned of 2 keys" and ``pretune`` queue
    nothing, so those keys were never tuned; ``tunecache get`` already refused the same answer."""
    from tests.factories import make_key, make_record
    from tunecache import Client
    from tunecache.http import IDENTITY_HEADER
    from tunecache_cli.coverage import state_of
    from tunecache_cli.pretune import is_tuned

    key = make_key(m=64)

    def serving(record: dict[str, object]) -> httpx.MockTransport:
        def handle(request: httpx.Request) -> httpx.Response:
            body = {"record": {**record, "id": 7, "key_hash": "0" * 64,
                               "created_at": "2026-01-01T00:00:00Z"}}  # fmt: skip
            return httpx.Response(200, json=body, headers={IDENTITY_HEADER: "tunecache/0"})

        return httpx.MockTransport(handle)

    good = make_record(key).model_dump(mode="json", by_alias=True)
    other = make_record(make_key(m=96)).model_dump(mode="json", by_alias=True)
    failed = {**good, "validation": {**good["validation"], "passed": False}}  # type: ignore[dict-item]
    for record, used in ((good, True), (other, False), ({**good, "status": "rejected"}, False),
                         (failed, False)):  # fmt: skip
        with Client("http://cache.test", transport=serving(record), token="") as client:
            assert is_tuned(key, client) is used, record
            assert state_of(key, client, client, {}) == ("tuned" if used else "missing", "")


def test_pretune_queues_a_key_whose_record_was_withdrawn_again(
    server: LiveServer, tmp_path: Path
) -> None:
    """A key tuned by a token then withdrawn (its record disputed until a verifier rechecks it):
    pretune said "1 queued", then "1/1 done", exit 0, and nothing ran; coverage said missing.
    The withdrawal opens the key's done job again (served by none), so pretune follows it: a
    daemon tunes the key again."""
    from tests.factories import AUTH, issue_token, make_record
    from tunecache.client import Client

    manifest = tmp_path / "one.toml"
    manifest.write_text('[[tune]]\nkernel = "matmul"\nbackends = ["tvm"]\n'
                        'shapes = [{M = 8, N = 16, K = 16}]\ntrials = 2\n')  # fmt: skip
    (key,) = parse_manifest(manifest.read_text(), str(manifest)).keys
    writer = issue_token(server.url, "write")
    with Client(server.url, token=writer) as client:
        job = client.create_job(key, trials=2).job
        claimed = client.claim_job("w", device_arch=key.device.arch, backends=["tvm"])
        assert claimed is not None and claimed.id == job.id
        record_id = client.upload(make_record(key)).record_id
        assert client.complete_job(job.id, "w", record_id).state == "done"
    assert cli("coverage", str(manifest), "--server", server.url).returncode == 0  # tuned
    tokens = httpx.get(f"{server.url}/v1/tokens", headers=AUTH, timeout=30).json()["items"]
    (writer_id,) = [t["id"] for t in tokens if t["scope"] == "write"]
    revoked = httpx.delete(f"{server.url}/v1/tokens/{writer_id}", params={"withdraw": "true"},
                           headers=AUTH, timeout=30)  # fmt: skip
    assert revoked.json()["withdrawn"] == 1, revoked.text
    assert cli("coverage", str(manifest), "--server", server.url).returncode == 1  # missing
    again = cli("pretune", str(manifest), "--server", server.url, "--no-wait")
    assert again.returncode == 0, again.stderr
    assert "0 tuned already, 1 queued" in again.stderr and "unserved" not in again.stderr
    (queued,) = httpx.get(f"{server.url}/v1/jobs", timeout=30).json()["items"]
    assert (queued["id"], queued["state"]) == (job.id, "queued")


def test_pretune_names_a_key_done_with_a_record_of_other_versions_as_stale(
    server: LiveServer, tmp_path: Path
) -> None:
    """A key's job done by a worker of other versions: no verifier serves it here, and pretune
    said its record waits for one (a review of the first version of the message)."""
    import dataclasses

    from tests.factories import issue_token, make_record
    from tunecache.client import Client

    manifest = tmp_path / "one.toml"
    manifest.write_text('[[tune]]\nkernel = "matmul"\nbackends = ["tvm"]\n'
                        'shapes = [{M = 8, N = 16, K = 16}]\ntrials = 2\n')  # fmt: skip
    (key,) = parse_manifest(manifest.read_text(), str(manifest)).keys
    elsewhere = dataclasses.replace(key, environment={**key.environment, "apache-tvm": "0.1.0"})
    with Client(server.url, token=issue_token(server.url, "write")) as client:
        job = client.create_job(key, trials=2).job
        assert client.claim_job("w", device_arch=key.device.arch, backends=["tvm"]) is not None
        record_id = client.upload(make_record(elsewhere)).record_id
        assert client.complete_job(job.id, "w", record_id).state == "done"
    again = cli("pretune", str(manifest), "--server", server.url)
    assert again.returncode == 1, again.stderr
    assert "1 unserved" in again.stderr and "tuned under other versions only" in again.stderr
    assert "daemon --verify" not in again.stderr, again.stderr


def test_coverage_says_which_tuned_keys_run_slower_than_torch_eager(
    server: LiveServer, tmp_path: Path
) -> None:
    """``coverage`` said "2 tuned", exit 0, of a key whose winner ran slower than torch eager
    (the dashboard and ``best`` say so): it is tuned, and its row and the summary say so."""
    from tests.factories import make_record
    from tests.test_noise import noisy_and_slower_record
    from tunecache import Client

    text = ('[[tune]]\nkernel = "matmul"\nbackends = ["tvm"]\n'
            'shapes = [{M = 8, N = 16, K = 16}, {M = 12, N = 16, K = 16}]\n')  # fmt: skip
    manifest = tmp_path / "two.toml"
    manifest.write_text(text)
    slow_key, fast_key = parse_manifest(text).keys
    with Client(server.url) as client:
        slow = client.upload(noisy_and_slower_record(slow_key)).record_id
        client.upload(make_record(fast_key))
    said = f"record {slow} is slower than torch eager"
    done = cli("coverage", str(manifest), "--server", server.url)
    assert done.returncode == 0, done.stderr  # both tuned
    [row] = [line for line in done.stdout.splitlines() if said in line]
    assert "tuned" in row and "M=8," in row
    lines = done.stdout.splitlines()  # the tally as it always reads, then the slower ones
    assert "2 tuned, 0 stale, 0 queued, 0 failed, 0 missing of 2 keys" in lines
    assert lines[-1] == "slower than torch eager: 1 tuned key (see the note)"
    as_json = cli("coverage", str(manifest), "--server", server.url, "--json")
    document = json.loads(as_json.stdout)
    notes = {row["digest"]: row["note"] for row in document["keys"]}
    assert notes == {slow_key.digest(): said, fast_key.digest(): ""}
    assert document["slower_than_eager"] == 1


def test_local_tuning_takes_a_job_whose_lease_lapsed_instead_of_waiting_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stopped with Ctrl-C left its job leased; the next ``pretune --local`` found it
    running, claimed nothing, and followed "1 running" until it was killed. It runs its daemons
    again once the lease lapses, and tunes the job here."""
    import time

    import tunecache_cli.pretune as pretune
    from tests.conftest import start_server
    from tests.factories import make_key, make_record
    from tunecache.client import Client
    from tunecache_cli.pretune import _until_no_retry

    db = tmp_path / "cache.db"
    live = start_server(f"sqlite:///{db}", db, tmp_path / "server.log")
    try:
        with Client(live.url) as client:
            job = client.create_job(make_key(9)).job
            assert client.claim_job("stopped", lease_seconds=3) is not None  # the Ctrl-C'd run
            drains: list[str] = []

            def drain() -> None:  # a once-daemon: takes what is claimable now, then stops
                taken = client.claim_job("here", lease_seconds=60)
                drains.append("took" if taken else "nothing")
                if taken is not None:
                    stored = client.upload(make_record(taken.key.to_key()))
                    client.complete_job(taken.id, "here", stored.record_id)

            started = time.monotonic()
            _until_no_retry(client, [job.key_hash], drain)
            assert drains == ["nothing", "took"]  # leased at first, then its lease lapsed
            assert time.monotonic() - started < 30
            (final,) = client.list_jobs().items
            assert (final.state, final.lease_owner) == ("done", None)
            # a lapsed job no daemon here takes (its device is not here): drained for at its
            # lapse and once more well past it (a server's clock may lag), then left to
            # follow(), not drained for every two seconds for good
            monkeypatch.setattr(pretune, "MAX_LEASE_WAIT", 5.0)
            other = client.create_job(make_key(10)).job
            assert client.claim_job("stopped", lease_seconds=2) is not None
            idle: list[float] = []
            started = time.monotonic()
            _until_no_retry(client, [other.key_hash], lambda: idle.append(time.monotonic()))
            assert [round(t - started) for t in idle] == [0, 5, 7], idle
    finally:
        live.stop()


def on_a_fake_clock(monkeypatch: pytest.MonkeyPatch, clock: list[float], jobs: Any) -> None:
    """``pretune``'s waits on ``clock`` (a sleep moves it on), its job list ``jobs``."""
    import tunecache_cli.pretune as pretune

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    monkeypatch.setattr(pretune, "all_jobs", jobs)
    monkeypatch.setattr(pretune.time, "time", lambda: clock[0])
    monkeypatch.setattr(pretune.time, "sleep", sleep)


def test_a_lapsed_job_none_here_takes_is_not_drained_again_while_another_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One job lapsed that no daemon here takes, beside one a live worker renews for an hour:
    the lapsed one was forgotten at each wait for the live one, and the daemons (with --ray, a
    cluster's tasks) ran again every 32 s, 115 times in the hour (a review's simulation)."""
    import datetime as dt
    from types import SimpleNamespace

    import tunecache_cli.pretune as pretune

    clock = [1_000_000.0]
    at = dt.datetime.fromtimestamp

    def jobs(_client: object, _hashes: object = None) -> dict[str, SimpleNamespace]:
        live = SimpleNamespace(id=2, state="running", attempts=1,
                               lease_expires_at=at(clock[0] + 60, dt.UTC))  # fmt: skip
        if clock[0] > 1_000_000.0 + 3600:  # the live one is done after an hour
            live = SimpleNamespace(id=2, state="done", attempts=1, lease_expires_at=None)
        lapsed = SimpleNamespace(id=1, state="running", attempts=1,
                                 lease_expires_at=at(1_000_000.0 - 5, dt.UTC))  # fmt: skip
        return {"a": lapsed, "b": live}

    on_a_fake_clock(monkeypatch, clock, jobs)
    drains: list[float] = []
    pretune._until_no_retry(None, ["a", "b"], lambda: drains.append(clock[0] - 1_000_000.0))
    assert drains == [0.0, 25.0], drains  # the first look, and once well past its lapse

    # this machine's clock 10 s ahead of the server's: the first drain past the lapse found it
    # leased still, and the job was given up for good (follow() said "1 running" forever)
    skew, taken = 10.0, []

    def server_jobs(_client: object, _hashes: object = None) -> dict[str, SimpleNamespace]:
        end = dt.datetime.fromtimestamp(1_000_000.0 + 60, dt.UTC)
        done = bool(taken)
        job = SimpleNamespace(id=3, state="done" if done else "running", attempts=1,
                              lease_expires_at=None if done else end)  # fmt: skip
        return {"c": job}

    def claim() -> None:  # the server's clock: the lease is over at its end, not before
        if clock[0] - skew >= 1_000_000.0 + 60:
            taken.append(clock[0])

    clock[0] = 1_000_000.0
    monkeypatch.setattr(pretune, "all_jobs", server_jobs)
    pretune._until_no_retry(None, ["c"], claim)
    assert taken, "never drained past the lapse by the server's clock"


def test_a_failed_job_none_here_takes_is_drained_at_its_retry_not_every_two_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failed job queued for its retry that no daemon here takes (a GPU job, this machine a
    CPU): the daemons (with --ray, a cluster's tasks) ran every 2 s until it ran out of
    attempts elsewhere, an hour at the longest retry. They run when its retry is due and once
    more well past it (a server's clock may lag), then it is left to follow()."""
    import datetime as dt
    from types import SimpleNamespace

    import tunecache_cli.pretune as pretune

    clock = [1_000_000.0]
    at = dt.datetime.fromtimestamp
    retry = at(1_000_000.0 + 600, dt.UTC)  # its retry, ten minutes on

    def jobs(_client: object, _hashes: object = None) -> dict[str, SimpleNamespace]:
        waiting = SimpleNamespace(id=1, state="queued", attempts=1, lease_expires_at=retry,
                                  updated_at=at(1_000_000.0, dt.UTC))  # fmt: skip
        return {"a": waiting}

    on_a_fake_clock(monkeypatch, clock, jobs)
    drains: list[float] = []

    def drain() -> None:
        drains.append(clock[0] - 1_000_000.0)
        assert len(drains) < 20, f"drained in a loop: {drains}"

    pretune._until_no_retry(None, ["a"], drain)
    assert drains == [0.0, 603.0, 630.0], drains  # the first look, at its retry, well past it

    # long overdue, and the first drain's daemons stopped before claiming it (a --once daemon
    # handed a job again stops): one drain well past its time gave it up for good
    overdue = at(1_000_000.0 - 600, dt.UTC)
    state = ["queued"]

    def late_jobs(_client: object, _hashes: object = None) -> dict[str, SimpleNamespace]:
        job = SimpleNamespace(id=2, state=state[0], attempts=1, lease_expires_at=overdue,
                              updated_at=overdue)  # fmt: skip
        return {"b": job}

    clock[0] = 1_000_000.0
    on_a_fake_clock(monkeypatch, clock, late_jobs)
    runs: list[float] = []

    def stops_early_once() -> None:
        runs.append(clock[0] - 1_000_000.0)
        if len(runs) > 1:
            state[0] = "done"

    pretune._until_no_retry(None, ["b"], stops_early_once)
    assert (runs, state[0]) == ([0.0, 2.0], "done"), runs


def test_pretune_names_a_key_it_followed_to_done_that_no_verifier_has_passed(
    tmp_path: Path,
) -> None:
    """Under the verified policy with no verifier running, a daemon's upload is stored pending:
    pretune followed the job to "1/1 done" and exited 0, while coverage said missing and a run
    again said "unserved", exit 1. It now says so at the end, as it does for a key found so."""
    import os
    import time

    from tests.conftest import start_server
    from tests.factories import issue_token, make_record
    from tunecache.client import Client

    db = tmp_path / "cache.db"
    live = start_server(f"sqlite:///{db}", db, tmp_path / "server.log",
                        args=["--policy", "verified"])  # fmt: skip
    try:
        manifest = tmp_path / "one.toml"
        manifest.write_text('[[tune]]\nkernel = "matmul"\nbackends = ["tvm"]\n'
                            'shapes = [{M = 8, N = 16, K = 16}]\ntrials = 2\n')  # fmt: skip
        (key,) = parse_manifest(manifest.read_text(), str(manifest)).keys
        following = subprocess.Popen(
            [sys.executable, "-m", "tunecache_cli", "pretune", str(manifest), "--server",
             live.url], stderr=subprocess.PIPE, text=True, cwd=REPO, env=dict(os.environ),
        )  # fmt: skip
        with Client(live.url, token=issue_token(live.url, "write")) as daemon:
            deadline = time.monotonic() + 120
            while (job := daemon.claim_job("w", device_arch=key.device.arch,
                                           backends=["tvm"])) is None:  # fmt: skip
                assert time.monotonic() < deadline and following.poll() is None
                time.sleep(0.2)
            record_id = daemon.upload(make_record(key)).record_id  # pending: a write token's
            assert daemon.complete_job(job.id, "w", record_id).state == "done"
        _, said = following.communicate(timeout=120)
    finally:
        live.stop()
    assert following.returncode == 1, said
    assert "1/1 done" in said and "tuned, but not served: matmul[" in said, said


def test_pretune_and_coverage_say_why_a_job_failed(tmp_path: Path) -> None:
    """``pretune`` ended "0/1 done, 0 running, 1 failed", exit 1, and ``coverage`` said
    "failed" with an empty note: why was only in the daemon's log and the dashboard. Both now
    give the job's attempts and the first line of its last error."""
    import threading
    import time

    from tests.conftest import start_server
    from tunecache.client import Client

    text = '[[tune]]\nkernel = "matmul"\nbackends = ["tvm"]\nshapes = [{M = 8, N = 16, K = 16}]\n'
    manifest = tmp_path / "one.toml"
    manifest.write_text(text)
    why = "RuntimeError: no schedule compiled for sm_90"
    live = start_server(f"sqlite:///{tmp_path / 'cache.db'}", tmp_path / "cache.db",
                        tmp_path / "server.log", env={"TUNECACHE_SERVER_RETRY_SECONDS": "0"})  # fmt: skip
    failures: list[int] = []

    def failing_daemon() -> None:  # fails each attempt it is handed, for the job's 3
        with Client(live.url) as worker:
            deadline = time.monotonic() + 120
            while len(failures) < 3 and time.monotonic() < deadline:
                job = worker.claim_job("w", lease_seconds=60)
                if job is None:
                    time.sleep(0.1)
                    continue
                worker.fail_job(job.id, "w", f"{why}\n  Traceback (most recent call last):")
                failures.append(job.attempts)

    try:
        thread = threading.Thread(target=failing_daemon)
        thread.start()
        done = cli("pretune", str(manifest), "--server", live.url)
        thread.join()
        assert failures == [1, 2, 3]
        assert done.returncode == 1, done.stderr
        key = parse_manifest(text).keys[0].short()
        said = f"attempt 3/3: reported by token bootstrap: {why}"  # a worker's words, whose
        assert f"failed: {key}: {said}\n" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr  # its first line only
        covered = cli("coverage", str(manifest), "--server", live.url)
        assert covered.returncode == 1, covered.stderr
        [row] = [line for line in covered.stdout.splitlines() if "M=8," in line]
        assert "failed" in row and said in row, covered.stdout
        as_json = json.loads(cli("coverage", str(manifest), "--server", live.url, "--json").stdout)
        assert as_json["keys"][0]["note"] == said
        again = cli("pretune", str(manifest), "--server", live.url, "--no-wait")  # queued again
        assert again.returncode == 0 and "1 queued" in again.stderr, again.stderr
        as_json = json.loads(cli("coverage", str(manifest), "--server", live.url, "--json").stdout)
        [queued] = as_json["keys"]  # the last run's error, not "attempt 0/3" of one that failed
        last = f"last error: reported by token bootstrap: {why}"
        assert (queued["state"], queued["note"]) == ("queued", last), queued
    finally:
        live.stop()


def test_a_failed_jobs_error_from_a_server_is_one_line_shown_as_it_is() -> None:
    """A job's error as a server answers it is taken as it is (a client reads old records'
    text), so a hostile server's escape sequence, bidi override or megabyte line must not
    reach the terminal as sent."""
    from tests.factories import claimed_job, make_key
    from tunecache.jobs import JobPublic
    from tunecache.strict import SERVED
    from tunecache_cli.pretune import ERROR_SHOWN, why_failed

    body = claimed_job(make_key(8)).model_dump(mode="json")
    body.update(state="failed", attempts=2, max_attempts=2, error_by="",  # the server's own
                error="\x1b[2J\x1b[8mhidden\u202e" + "\U000e0041" * 5000 + "\nsecond line")  # fmt: skip
    note = why_failed(JobPublic.model_validate(body, context=SERVED))
    assert note.startswith("attempt 2/2: \\x1b[2J\\x1b[8mhidden\\u202e") and note.endswith("...")
    assert "\x1b" not in note and "\u202e" not in note and "second line" not in note
    assert len(note) <= len("attempt 2/2: ") + ERROR_SHOWN + len("...")  # as shown, escapes too


def test_a_jobs_error_says_whose_words_it_is() -> None:
    """A write token may fail a job it claimed with any text: one that read as the server's own
    ("… the lease was token alice") named a teammate as the token to revoke in every team's
    ``coverage``. A worker's report says whose it is, as the dashboard does."""
    from tests.factories import claimed_job, make_key
    from tunecache.jobs import JobPublic
    from tunecache.strict import SERVED
    from tunecache_cli.pretune import last_error

    forged = "its worker stopped renewing the lease of its last attempt; the lease was token alice"
    body = {**claimed_job(make_key(8)).model_dump(mode="json"), "error": forged}

    def said(error_by: str | None) -> str:
        return last_error(JobPublic.model_validate({**body, "error_by": error_by}, context=SERVED))

    assert said("mallory") == f"reported by token mallory: {forged}"
    assert said("\u0430lice") == f'reported by token "\\u0430lice": {forged}'  # not alice
    assert said("") == forged  # the server's own words
    assert said(None) == f"reported by a worker or the server (not recorded): {forged}"


def test_a_manifests_jobs_are_read_by_key_not_as_the_whole_queue(
    server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pretune`` and ``coverage`` read the whole queue, every poll: a write token growing it
    with failed jobs (never open, so past the open-jobs cap) made every team's read megabytes,
    then fail past its bounds (exit 3). Now a manifest's jobs are read by their keys."""
    import tunecache_cli.job_reads
    from tests.factories import make_key
    from tunecache.client import Client
    from tunecache.errors import ServerError
    from tunecache_cli.job_reads import all_jobs

    text = ('[[tune]]\nkernel = "matmul"\nbackends = ["tvm"]\n'
            'shapes = [{M = 8, N = 16, K = 16}, {M = 12, N = 16, K = 16}]\n')  # fmt: skip
    manifest = tmp_path / "two.toml"
    manifest.write_text(text)
    ours = [key.digest() for key in parse_manifest(text).keys]
    with Client(server.url) as client:
        for m in range(1, 61):  # someone else's queue
            client.create_job(make_key(m * 8 + 1000))
        client.create_job(parse_manifest(text).keys[0])
        monkeypatch.setattr(tunecache_cli.job_reads, "MAX_JOB_BYTES", 16_384)  # the queue: past
        with pytest.raises(ServerError, match="more than one read holds"):
            all_jobs(client)
        found = all_jobs(client, ours)
    assert list(found) == ours[:1] and found[ours[0]].state == "queued"
    listed = httpx.get(f"{server.url}/v1/jobs", params={"key_hash": ours})
    assert [job["key_hash"] for job in listed.json()["items"]] == ours[:1]
    assert listed.json()["count"] == 1
    too_many = httpx.get(f"{server.url}/v1/jobs", params={"key_hash": ours * 26})  # 52
    assert too_many.status_code == 422, too_many.text
    assert httpx.get(f"{server.url}/v1/jobs", params={"key_hash": "x"}).status_code == 422


def test_a_server_without_the_key_filter_is_read_whole() -> None:
    """An older server answers ``?key_hash=`` with every job: its listing is read whole, and
    only the asked keys' jobs kept (none of another key's taken as this one's)."""
    from tests.factories import claimed_job, make_key
    from tunecache.client import Client
    from tunecache.http import IDENTITY_HEADER
    from tunecache_cli.job_reads import all_jobs

    jobs = [claimed_job(make_key(m), job_id=m).model_dump(mode="json") for m in (8, 16, 24)]
    asked: list[str] = []

    def older(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        offset = int(request.url.params.get("offset", 0))
        body = {"items": jobs[offset:], "count": len(jobs)}
        return httpx.Response(200, json=body, headers={IDENTITY_HEADER: "tunecache/test"})

    wanted = [jobs[1]["key_hash"], "f" * 64]
    with Client("http://older.test", transport=httpx.MockTransport(older)) as client:
        found = all_jobs(client, wanted)
    assert list(found) == [jobs[1]["key_hash"]] and found[wanted[0]].id == 16
    assert "key_hash=" in asked[0] and "key_hash=" not in asked[-1]  # then the whole queue


def test_pretune_follows_its_manifests_keys_not_those_a_server_names() -> None:
    """``pretune`` followed (and ``--local`` claimed) the key hash the server's answer named: a
    server answering a key's queuing with another key's job had a daemon of ``--local`` tune
    that key, its own check passed by the very hash the server chose."""
    from tests.factories import claimed_job, make_key, miss
    from tunecache.client import Client
    from tunecache.errors import ServerError
    from tunecache.http import IDENTITY_HEADER
    from tunecache_cli.pretune import queue

    manifest = parse_manifest('[[tune]]\nkernel = "matmul"\nbackends = ["tvm"]\n'
                              "shapes = [{M = 8, N = 16, K = 16}]\n")  # fmt: skip
    other = claimed_job(make_key(4096)).model_dump(mode="json")

    def hostile(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/lookup":
            return miss()  # type: ignore[no-any-return]
        return httpx.Response(201, json={"job": other, "created": True},
                              headers={IDENTITY_HEADER: "tunecache/test"})  # fmt: skip

    with (
        Client("http://hostile.test", transport=httpx.MockTransport(hostile)) as client,
        pytest.raises(ServerError, match="with the job of another key: a bad answer"),
    ):
        queue(client, manifest)
