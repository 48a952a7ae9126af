"""Snapshots: export the winners of an arch with an ETag, import with "the faster wins", the
client's local snapshot file, and the ``tunecache snapshot`` commands."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from cache_server.embedded import free_port
from tests.conftest import LiveServer, start_server
from tests.factories import AUTH, CPU, knobs, make_key, make_record
from tunecache import Client, InvalidInput
from tunecache.device import DeviceFingerprint
from tunecache.key import Key
from tunecache.schemas import RecordCreate
from tunecache.snapshot import (
    MAX_SNAPSHOT_RECORDS,
    SNAPSHOT_FORMAT,
    SnapshotFilters,
    SnapshotPublic,
    load_snapshot,
    render_snapshot,
    save_snapshot,
    snapshot_etag,
)

DEFAULT = {"schedule": "default"}
ARCH = "cpu-avx2"  # the arch of tests.factories.CPU
H100 = DeviceFingerprint(kind="cuda", arch="sm_90", name="h100", units=132, memory_gb=80)


def gpu_key(m: int = 64) -> Key:
    return Key(
        kernel="matmul",
        source_hash="0123456789abcdef",
        backend="triton",
        problem={"M": m, "N": 64, "K": 64},
        dtype="float16",
        device=H100,
        environment={"triton": "3.2.0"},
    )


def body_of(record: RecordCreate) -> dict[str, Any]:
    return record.model_dump(mode="json", by_alias=True)


def upload(url: str, record: RecordCreate) -> None:
    response = httpx.post(f"{url}/v1/records", json=body_of(record), headers=AUTH, timeout=30)
    assert response.status_code == 201, response.text


def export(url: str, headers: dict[str, str] | None = None, **params: str) -> httpx.Response:
    params.setdefault("device_arch", ARCH)
    return httpx.get(f"{url}/v1/snapshot", params=params, headers=headers, timeout=30)


def import_(url: str, document: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/v1/snapshot", json=document, headers=AUTH, timeout=60)


def document(*records: RecordCreate, arch: str = ARCH) -> dict[str, Any]:
    return {
        "format": SNAPSHOT_FORMAT,
        "filters": {"device_arch": arch},
        "records": [body_of(r) for r in records],
    }


def record_count(url: str) -> int:
    count: int = httpx.get(f"{url}/health", timeout=10).json()["records"]
    return count


def times(response: httpx.Response) -> dict[str, float]:
    """Winner median times by key digest, checking the records are in key-hash order."""
    snapshot = SnapshotPublic.model_validate(response.json())
    digests = [r.key.digest() for r in snapshot.records]
    assert digests == sorted(digests)
    return {r.key.digest(): r.timing.median_ms for r in snapshot.records}


# -- export -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_export_holds_exactly_the_winners_of_the_arch(any_server: LiveServer) -> None:
    url = any_server.url
    fast, unvalidated, softmax = make_key(64), make_key(128), make_key(64, kernel="softmax")
    for record in (
        make_record(fast, time_ms=2.0),
        make_record(fast, time_ms=1.0),
        make_record(fast, time_ms=0.5, passed=False),  # faster but never served
        make_record(unvalidated, time_ms=0.3, passed=False),
        make_record(softmax, time_ms=3.0),
        make_record(gpu_key(), time_ms=0.1),  # another arch
    ):
        upload(url, record)

    response = export(url)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["format"] == SNAPSHOT_FORMAT and body["filters"] == {"device_arch": ARCH}
    assert "created_at" not in body
    assert all("trials" not in record for record in body["records"])  # winners only, no trials
    assert times(response) == {fast.digest(): 1.0, softmax.digest(): 3.0}

    assert times(export(url, kernel="softmax")) == {softmax.digest(): 3.0}
    assert times(export(url, backend="tvm", device_name="test-cpu")) == {
        fast.digest(): 1.0,
        softmax.digest(): 3.0,
    }
    assert times(export(url, device_name="other-cpu")) == {}
    assert times(export(url, device_arch="sm_90")) == {gpu_key().digest(): 0.1}
    assert times(export(url, device_arch="sm_80")) == {}


@pytest.mark.slow
def test_etag_is_stable_until_a_faster_winner_and_honours_if_none_match(
    any_server: LiveServer,
) -> None:
    url, key = any_server.url, make_key()
    upload(url, make_record(key, time_ms=1.0))
    first, second = export(url), export(url)
    etag = first.headers["etag"]
    assert etag == second.headers["etag"] and first.content == second.content
    assert etag == snapshot_etag(SnapshotPublic.model_validate(first.json()).records)

    for header in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        cached = export(url, headers={"If-None-Match": header})
        assert cached.status_code == 304, header
        assert cached.content == b"" and cached.headers["etag"] == etag
    assert export(url, headers={"If-None-Match": '"other"'}).status_code == 200

    upload(url, make_record(key, time_ms=2.0))  # slower: the winner stays
    upload(url, make_record(key, time_ms=0.1, passed=False))  # unvalidated: never served
    assert export(url).headers["etag"] == etag
    upload(url, make_record(key, time_ms=0.5))  # faster: a new winner, a new ETag
    changed = export(url, headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag
    assert times(changed) == {key.digest(): 0.5}


# -- import -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_import_reproduces_the_winners_and_the_faster_validated_record_wins(
    any_server: LiveServer, tmp_path: Path
) -> None:
    url, a, b = any_server.url, make_key(64), make_key(128)
    upload(url, make_record(a, time_ms=1.0))
    upload(url, make_record(b, time_ms=3.0))
    exported = export(url)

    (tmp_path / "copy").mkdir()
    copy_db = tmp_path / "copy" / "cache.db"
    copy = start_server(f"sqlite:///{copy_db}", copy_db, tmp_path / "copy" / "server.log")
    try:
        result = import_(copy.url, exported.json())
        assert result.status_code == 200, result.text
        assert result.json() == {"imported": 2, "winners_changed": 2}
        again = export(copy.url)
        assert again.headers["etag"] == exported.headers["etag"]
        assert again.content == exported.content  # byte-identical on another server and database
        twice = import_(copy.url, exported.json())  # its records are this token's already
        assert twice.json() == {"imported": 0, "winners_changed": 0}
        assert record_count(copy.url) == 2
    finally:
        copy.stop()

    before = record_count(url)
    slower = import_(url, document(make_record(a, time_ms=2.0)))
    assert slower.json() == {"imported": 1, "winners_changed": 0}
    assert export(url).headers["etag"] == exported.headers["etag"]

    new_key = make_key(256)
    merged = import_(
        url,
        document(
            make_record(a, time_ms=0.5),
            make_record(a, time_ms=0.1, passed=False),
            make_record(new_key, time_ms=0.2, passed=False),
        ),
    )
    assert merged.json() == {"imported": 3, "winners_changed": 1}
    assert times(export(url)) == {a.digest(): 0.5, b.digest(): 3.0}  # unvalidated: stored only
    assert record_count(url) == before + 4
    listed = httpx.get(f"{url}/v1/records", params={"validated": False}, timeout=10).json()
    assert listed["count"] == 2

    # One document: a record no database may hold (a NUL character) fails the whole import with
    # a 422 naming it, never a 5xx, and stores nothing — on every database alike.
    refused = body_of(make_record(make_key(512)))
    refused["config_summary"] = "tile\u0000"
    mixed = document() | {"records": [body_of(make_record(make_key(1024))), refused]}
    response = import_(url, mixed)
    assert response.status_code == 422 and "NUL" in response.text, response.text
    assert record_count(url) == before + 4


def _with_record(**changes: Any) -> dict[str, Any]:
    record = body_of(make_record())
    for path, value in changes.items():
        target = record
        *parents, last = path.split("__")
        for part in parents:
            target = target[part]
        target[last] = value
    return document() | {"records": [record]}


MALFORMED = {
    "not-json": (b"{not json", "JSON decode error"),
    "a-list": (b"[]", "valid dictionary"),
    "format": (document() | {"format": "tunecache-snapshot/2"}, SNAPSHOT_FORMAT),
    "no-filters": ({"format": SNAPSHOT_FORMAT, "records": []}, "Field required"),
    "extra-field": (document() | {"created_by": "me"}, "Extra inputs are not permitted"),
    "bad-arch": (document() | {"filters": {"device_arch": "not an arch"}}, "pattern"),
    "bad-timing": (_with_record(timing__median_ms=-1.0), "greater than or equal to 0.000001"),
    "bad-backend": (_with_record(key__backend="cuda-magic"), "triton"),
    "other-arch": (document(make_record(), make_record(gpu_key())), "device_arch is 'sm_90'"),
    "too-many": (document() | {"records": [{}] * (MAX_SNAPSHOT_RECORDS + 1)}, "at most 50000"),
}


@pytest.mark.slow
@pytest.mark.parametrize(("content", "reason"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_imports_are_422_with_the_reason_and_store_nothing(
    shared_server: LiveServer, content: bytes | dict[str, Any], reason: str
) -> None:
    data = content if isinstance(content, bytes) else json.dumps(content).encode()
    response = httpx.post(
        f"{shared_server.url}/v1/snapshot",
        content=data,
        headers={"content-type": "application/json", **AUTH},
        timeout=60,
    )
    assert response.status_code == (400 if content == b"{not json" else 422), response.text
    assert reason in response.text
    assert record_count(shared_server.url) == 0


@pytest.mark.slow
def test_an_import_over_the_body_limit_is_413(shared_server: LiveServer) -> None:
    record = body_of(make_record())
    record["config"] = {"blob": "x" * (17 * 2**20)}
    response = import_(shared_server.url, document() | {"records": [record]})
    assert response.status_code == 413
    assert "limit" in response.json()["detail"]
    assert record_count(shared_server.url) == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "params",
    [
        {},
        {"device_arch": "a b"},
        {"device_arch": ARCH, "backend": "cuda"},
        {"device_arch": ARCH, "arch": "x"},
    ],
)
def test_bad_export_filters_are_422(shared_server: LiveServer, params: dict[str, str]) -> None:
    response = httpx.get(f"{shared_server.url}/v1/snapshot", params=params, timeout=10)
    assert response.status_code == 422, response.text


# -- the client's local snapshot file ---------------------------------------------------------


class RefusingTransport(httpx.MockTransport):
    """No server at all: every request fails to connect, and is counted."""

    def __init__(self) -> None:
        self.calls = 0
        super().__init__(self.refuse)

    def refuse(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        raise httpx.ConnectError("connection refused", request=request)


def test_client_looks_up_from_a_snapshot_file_without_a_server(tmp_path: Path) -> None:
    a, b, c = make_key(64), make_key(128), make_key(256)
    records = [
        make_record(a, time_ms=2.0, config=knobs(2)),
        make_record(a, time_ms=1.0, config=knobs(1)),  # two for one key: the faster is served
        make_record(b, time_ms=0.5, passed=False),  # unvalidated: never served
    ]
    body, etag = render_snapshot(SnapshotFilters(device_arch=ARCH), records)
    path = tmp_path / "images" / "winners.json"
    save_snapshot(path, json.loads(body))
    assert path.read_bytes() == body  # written byte for byte, atomically
    assert [p.name for p in path.parent.iterdir()] == ["winners.json"]
    assert snapshot_etag(load_snapshot(path).records) == etag

    transport = RefusingTransport()
    with Client("http://cache.test", transport=transport, snapshot=path) as client:
        hits = [client.lookup(a, default=DEFAULT) for _ in range(3)]
        assert transport.calls == 0  # answered from the snapshot, no server asked
        unvalidated = client.lookup(b, default=DEFAULT)
        miss = client.lookup(c, default=DEFAULT)
    assert {hit.source for hit in hits} == {"snapshot"}
    assert hits[0].hit and hits[0].config == knobs(1)
    assert hits[0].record is None  # a snapshot holds no server record ids
    assert (unvalidated.source, unvalidated.config) == ("default", DEFAULT)
    assert (miss.source, miss.hit) == ("default", False)
    assert transport.calls == 1  # the first miss; the server is then skipped for retry_after


def test_tunecache_snapshot_is_the_clients_snapshot_unless_it_is_given_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The docs' "Point ``$TUNECACHE_SNAPSHOT`` at it": a ``Client`` given no ``snapshot=``
    answers from that file (it did not: only the Triton drop-in read the variable); ``""``
    turns it off."""
    key = make_key(64)
    body, _ = render_snapshot(SnapshotFilters(device_arch=ARCH),
                              [make_record(key, config=knobs(3))])  # fmt: skip
    path = tmp_path / "winners.json"
    save_snapshot(path, json.loads(body))
    monkeypatch.setenv("TUNECACHE_SNAPSHOT", str(path))
    # Another variable set wrong does not stop a client given the rest (the Triton drop-in's).
    monkeypatch.setenv("TUNECACHE_TIMEOUT", "abc")
    with Client("http://cache.test", transport=RefusingTransport(), token="",
                timeout=0.5) as client:  # fmt: skip
        found = client.lookup(key, default=DEFAULT)
    assert (found.source, found.config) == ("snapshot", knobs(3))
    with Client("http://cache.test", transport=RefusingTransport(), snapshot="", token="",
                timeout=0.5) as client:  # fmt: skip
        assert client.lookup(key, default=DEFAULT).source == "default"


def test_a_snapshot_answers_same_arch_and_nearest_bucket_offline_saying_which_rule(
    tmp_path: Path,
) -> None:
    """An image baked with an arch's snapshot serves other devices of the arch and other shapes
    of a bucket with no server, and says by which rule."""
    import dataclasses

    tuned_at = {m: make_key(m) for m in (64, 48)}
    records = [make_record(key, time_ms=1.0, config=knobs(m)) for m, key in tuned_at.items()]
    body, _ = render_snapshot(SnapshotFilters(device_arch=ARCH), records)
    path = tmp_path / "winners.json"
    save_snapshot(path, json.loads(body))
    bigger = dataclasses.replace(CPU, name="another-cpu-of-the-arch", units=64)
    transport = RefusingTransport()
    with Client("http://cache.test", transport=transport, snapshot=path) as client:
        exact = client.lookup(make_key(64))
        same_arch = client.lookup(dataclasses.replace(make_key(64), device=bigger))
        bucket = client.lookup(make_key(40))  # bucket 64 holds 48 and 64: 48 is nearer
        other_bucket = client.lookup(make_key(200), default=DEFAULT)
    assert (exact.source, exact.rule, exact.config) == ("snapshot", "exact", knobs(64))
    assert (same_arch.source, same_arch.rule) == ("snapshot", "same_arch")
    assert same_arch.config == knobs(64)
    assert (bucket.source, bucket.rule, bucket.config) == ("snapshot", "bucket", knobs(48))
    assert (other_bucket.source, other_bucket.rule) == ("default", None)
    assert transport.calls == 1  # only the miss asked the (unreachable) server


@pytest.mark.parametrize(
    "content",
    [None, b"", b"{not json", b'{"format": "other"}', b'{"format": "tunecache-snapshot/1", "filt'],
    ids=["missing", "empty", "not-json", "wrong-format", "truncated"],
)
def test_a_missing_or_corrupt_snapshot_is_logged_once_and_ignored(
    tmp_path: Path, content: bytes | None, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "winners.json"
    if content is not None:
        path.write_bytes(content)
    key = make_key()
    with (
        caplog.at_level(logging.WARNING, logger="tunecache.client"),
        Client("http://cache.test", transport=RefusingTransport(), snapshot=path) as client,
    ):
        results = [client.lookup(key, default=DEFAULT) for _ in range(3)]
    assert [(r.source, r.config) for r in results] == [("default", DEFAULT)] * 3
    snapshot_warnings = [r for r in caplog.records if "snapshot" in r.getMessage()]
    assert len(snapshot_warnings) == 1
    assert str(path) in snapshot_warnings[0].getMessage()


def test_save_snapshot_refuses_an_invalid_document_and_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "winners.json"
    save_snapshot(path, document(make_record()))
    good = path.read_bytes()
    with pytest.raises(InvalidInput, match="not a valid snapshot"):
        save_snapshot(path, document(make_record(gpu_key())))
    with pytest.raises(InvalidInput, match="cannot write"):
        save_snapshot(tmp_path, document(make_record()))  # a directory
    assert path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["winners.json"]


# -- the command line -------------------------------------------------------------------------


def tunecache(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tunecache_cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_import_of_a_snapshot_whose_every_record_is_left_out_is_bad_input(
    server: LiveServer, tmp_path: Path
) -> None:
    """Every record of a tampered snapshot left out: it said 'imported 0 records', exit 0. Now
    exit 2 naming the file; one record left out of two still imports the other."""
    upload(server.url, make_record(make_key(64), time_ms=1.0))
    upload(server.url, make_record(make_key(128), time_ms=2.0))
    out = tmp_path / "two.json"
    assert tunecache("snapshot", "export", "--arch", CPU.arch, "--server", server.url,
                     "-o", str(out)).returncode == 0  # fmt: skip
    document = json.loads(out.read_text())
    document["records"][0]["config"] = {"evil": 1}  # outside the closed schema
    (tmp_path / "one_bad.json").write_text(json.dumps(document))
    document["records"][1]["config"] = {"evil": 2}
    (tmp_path / "all_bad.json").write_text(json.dumps(document))
    some = tunecache("snapshot", "import", str(tmp_path / "one_bad.json"), "--server", server.url)
    assert some.returncode == 0 and "imported 1 record from" in some.stdout, some.stderr
    none = tunecache("snapshot", "import", str(tmp_path / "all_bad.json"), "--server", server.url)
    assert none.returncode == 2, none.stdout
    assert "no record of it may be imported" in none.stderr and "Traceback" not in none.stderr


@pytest.mark.slow
def test_cli_export_import_round_trip(server: LiveServer, tmp_path: Path) -> None:
    upload(server.url, make_record(make_key(64), time_ms=1.0))
    upload(server.url, make_record(make_key(128), time_ms=2.0))
    upload(server.url, make_record(gpu_key(), time_ms=0.1))
    out = tmp_path / "snap" / "cpu.json"
    out.parent.mkdir()  # -o's folder is never created (docs/cli.md): a mistyped one is said

    done = tunecache("snapshot", "export", "--arch", ARCH, "--server", server.url, "-o", str(out))
    assert done.returncode == 0, done.stderr
    served = export(server.url, provenance="true")  # the command states who measured what
    assert out.read_bytes() == served.content
    assert served.headers["etag"] != export(server.url).headers["etag"]  # another document
    assert "exported 2 winners" in done.stdout and served.headers["etag"] in done.stdout
    none = tunecache("snapshot", "export", "--arch", "sm_120", "--server", server.url, "-o",
                     str(tmp_path / "none.json"))  # fmt: skip
    assert none.returncode == 0 and "exported 0 winners" in none.stdout  # an empty one is fine,
    assert "no winner matches arch 'sm_120': is each" in none.stderr  # but said (a typo, perhaps)
    # an arch no device has, of which the server holds nothing: a typo, refused, nothing written
    typo = tunecache("snapshot", "export", "--arch", "cpu-avx51", "--server", server.url, "-o",
                     str(tmp_path / "typo.json"))  # fmt: skip
    assert typo.returncode == 2 and "did you mean cpu-avx512?" in typo.stderr, typo.stderr
    assert "nothing written" in typo.stderr and not (tmp_path / "typo.json").exists()
    older = tunecache("snapshot", "export", "--arch", "sm_37", "--server", server.url, "-o",
                      str(tmp_path / "older.json"))  # fmt: skip
    assert older.returncode == 0, older.stderr  # any GPU's arch: no typo this can tell
    # A mistyped kernel was blamed on the arch: "is 'cpu-…' an arch the server has winners of?"
    none = tunecache("snapshot", "export", "--arch", ARCH, "--kernel", "nosuch", "--server",
                     server.url, "-o", str(tmp_path / "none.json"))  # fmt: skip
    assert none.returncode == 0 and "exported 0 winners" in none.stdout
    assert f"no winner matches arch {ARCH!r}, kernel 'nosuch': is each" in none.stderr

    done = tunecache("snapshot", "import", str(out), "--server", server.url)
    assert done.returncode == 0, done.stderr
    assert "imported 2 records" in done.stdout and "0 winners changed" in done.stdout
    assert export(server.url, provenance="true").headers["etag"] == served.headers["etag"]


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["export", "--arch", "not an arch", "-o", "x.json"], 2, "--arch"),
        (["export", "--arch", ARCH, "--backend", "cuda", "-o", "x.json"], 2, "--backend"),
        (["export", "--arch", ARCH], 2, "-o/--output"),
        (["import", "missing.json"], 2, "cannot read snapshot"),
        (["import", "corrupt.json"], 2, "is not a valid snapshot"),
        (["export", "--arch", ARCH, "-o", "x.json", "--server", "ftp://x"], 2, "http://"),
        (["export", "--arch", ARCH, "-o", "x.json", "--server", "DEAD"], 3, "failed"),
        (["import", "good.json", "--server", "DEAD"], 3, "failed"),
    ],
)
def test_cli_bad_input_exits_2_and_an_unreachable_server_3(
    tmp_path: Path, argv: list[str], code: int, message: str
) -> None:
    (tmp_path / "corrupt.json").write_text('{"format": "tunecache-snapshot/1"')
    save_snapshot(tmp_path / "good.json", document(make_record()))
    dead = f"http://127.0.0.1:{free_port()}"
    argv = [str(tmp_path / a) if a.endswith(".json") else a for a in argv]
    done = tunecache("snapshot", *[dead if a == "DEAD" else a for a in argv])
    assert done.returncode == code, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.json").exists()


def test_sync_downloads_this_arch_once_and_the_resolver_reads_it(
    server: LiveServer, tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    from tunecache import key_for

    key = key_for("matmul", "tvm", {"M": 64, "N": 64, "K": 64}, "float32")  # this machine's CPU
    with Client(server.url) as client:
        client.upload(make_record(key, time_ms=1.0, config=knobs(3)))
    path = tmp_path / "snapshot.json"

    def sync() -> str:
        done = subprocess.run([sys.executable, "-m", "tunecache_cli", "sync", "--server",
                               server.url, "-o", str(path)], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "wrote 1 winner of" in sync() and path.exists()
    assert "is up to date" in sync()  # the file's ETag went as If-None-Match: 304
    named = tmp_path / "named.json"  # no -o: the variable's file (its folder exists)
    env = {**os.environ, "TUNECACHE_SNAPSHOT": str(named)}
    done = subprocess.run([sys.executable, "-m", "tunecache_cli", "sync", "--server", server.url],
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert done.returncode == 0 and f"to {named}" in done.stdout and named.exists(), done.stderr
    none = subprocess.run([sys.executable, "-m", "tunecache_cli", "sync", "--arch", "sm_90",
                           "--server", server.url, "-o", str(tmp_path / "none.json")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert none.returncode == 0 and "wrote 0 winners of sm_90" in none.stdout  # said, then:
    assert "no winner matches arch 'sm_90': is each" in none.stderr, none.stderr
    # Every empty snapshot has one ETag: an empty sm_90 file read as an up-to-date sm_80 one
    other = subprocess.run([sys.executable, "-m", "tunecache_cli", "sync", "--arch", "sm_80",
                            "--server", server.url, "-o", str(tmp_path / "none.json")],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert other.returncode == 0 and "wrote 0 winners of sm_80" in other.stdout, other.stdout
    assert json.loads((tmp_path / "none.json").read_text())["filters"] == {"device_arch": "sm_80"}
    # A mistyped arch replaced the good snapshot with an empty one, exit 0: now refused, kept
    held = path.read_bytes()
    typo = subprocess.run([sys.executable, "-m", "tunecache_cli", "sync", "--arch", "cpu-avx51",
                           "--server", server.url, "-o", str(path)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert typo.returncode == 2 and "did you mean cpu-avx512?" in typo.stderr, typo.stderr
    assert path.read_bytes() == held
    with Client("http://127.0.0.1:9", snapshot=path) as offline:
        hit = offline.lookup(key)
    assert (hit.source, hit.rule, hit.config) == ("snapshot", "exact", knobs(3))


def test_sync_and_export_leave_a_file_that_is_not_a_snapshot_as_it_is(
    server: LiveServer, tmp_path: Path
) -> None:
    """``sync -o notes.txt`` replaced the notes with a snapshot (and ``TUNECACHE_SNAPSHOT`` set
    to the wrong file, at every sync): a file that is not a snapshot is refused before the
    server is asked, and kept; an empty file, or a snapshot this version does not read, is
    still replaced."""
    import os

    dead = f"http://127.0.0.1:{free_port()}"
    notes = tmp_path / "notes.txt"
    other = tmp_path / "settings.json"
    for path, text in ((notes, "my notes\n"), (other, '{"format": "vscode/1", "x": 1}')):
        path.write_text(text)
        for argv in (
            ["sync", "--server", dead, "-o", str(path)],
            ["snapshot", "export", "--arch", ARCH, "--server", dead, "-o", str(path)],
        ):
            done = tunecache(*argv)
            assert done.returncode == 2, (argv, done.stderr)  # not 3: the server never asked
            assert f"-o {path} is a file that is not a tunecache snapshot" in done.stderr
            assert "Traceback" not in done.stderr and path.read_text() == text
    env = {**os.environ, "TUNECACHE_SNAPSHOT": str(notes)}
    done = subprocess.run([sys.executable, "-m", "tunecache_cli", "sync", "--server", dead],
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert done.returncode == 2 and "TUNECACHE_SNAPSHOT" in done.stderr, done.stderr
    assert notes.read_text() == "my notes\n"

    deep = tmp_path / "deep.json"  # nested past Python's stack: an internal error
    deep.write_text('{"a":' * 3000 + "1" + "}" * 3000)
    done = tunecache("sync", "--server", dead, "-o", str(deep))
    assert done.returncode == 2 and "not a tunecache snapshot" in done.stderr, done.stderr

    empty, newer, cut = (tmp_path / f"{name}.json" for name in ("empty", "newer", "cut"))
    empty.write_text("")
    newer.write_text('{"format": "tunecache-snapshot/9", "filters": {}, "records": 7}')
    cut.write_text('{"filters":{"device_arch":"cpu-avx2"},"format":"tunecache-snapshot/1","rec')
    for path in (empty, newer, cut):  # none any use: replaced (a lookup calls the cut one corrupt)
        done = tunecache("sync", "--arch", ARCH, "--server", server.url, "-o", str(path))
        assert done.returncode == 0, done.stderr
        assert json.loads(path.read_text())["format"] == SNAPSHOT_FORMAT


def test_a_snapshot_carries_the_believed_time_not_one_a_verifier_flagged(
    server: LiveServer, tmp_path: Path
) -> None:
    """An uploader claimed 1 ms; a verifier re-timed it at 3 ms (flagged: not believed). The
    export carried the claimed 1 ms and its comparisons, and on a server that imported it the
    record won over an honest 2 ms one; now it carries the verifier's 3 ms and no comparisons."""
    from tests.factories import issue_token
    from tests.test_best import with_eager
    from tunecache.verification import VerificationCreate

    key = make_key(96)
    with Client(server.url) as client:
        record_id = client.upload(with_eager(key, 1.0, 2.0, 2.0)).record_id
    with Client(server.url, token=issue_token(server.url, "verify")) as client:
        assert client.claim_verification("v1", device_arch=ARCH, backends=[key.backend])
        checked = client.submit_verification(record_id, VerificationCreate(
            worker="v1", outcome="passed", device_name="verifier-cpu",
            timing=make_record(key, time_ms=3.0).timing,
            validation=make_record(key).validation))  # fmt: skip
    assert checked.verification is not None and checked.verification.timing_flag
    exported = export(server.url).json()
    [carried] = exported["records"]
    assert carried["timing"]["median_ms"] == 3.0 and carried["baselines"] == []

    db_path = tmp_path / "other.db"
    other = start_server(f"sqlite:///{db_path}", db_path, tmp_path / "other.log")
    try:
        honest = make_record(key, time_ms=2.0, config=knobs(7))
        upload(other.url, honest)
        answer = import_(other.url, exported)
        assert answer.status_code == 200, answer.text
        assert answer.json()["winners_changed"] == 0
        with Client(other.url) as client:
            assert client.lookup(key, default=DEFAULT).config == honest.config
    finally:
        other.stop()


def test_beside_a_verifiers_time_a_snapshot_keeps_only_interleaved_comparisons(
    server: LiveServer,
) -> None:
    """A verifier re-timed the record at 1.1 ms, close to its uploader's 1 ms: the export
    carries the verifier's time, and of the uploader's baselines only the interleaved
    comparison (its ratio stands on its own); a default config's 3 ms timed apart would have
    been divided by the verifier's median, another machine's."""
    from tests.factories import issue_token
    from tests.test_best import with_eager
    from tunecache.measured import BaselineModel
    from tunecache.verification import VerificationCreate

    key = make_key(97)
    record = with_eager(key, 1.0, 2.0, 2.0)
    apart = BaselineModel(name="default_config", timing=make_record(key, time_ms=3.0).timing)
    record = record.model_copy(update={"baselines": [*record.baselines, apart]})
    with Client(server.url) as client:
        record_id = client.upload(record).record_id
    with Client(server.url, token=issue_token(server.url, "verify")) as client:
        assert client.claim_verification("v1", device_arch=ARCH, backends=[key.backend])
        client.submit_verification(record_id, VerificationCreate(
            worker="v1", outcome="passed", device_name="verifier-cpu",
            timing=make_record(key, time_ms=1.1).timing,
            validation=make_record(key).validation))  # fmt: skip
    [carried] = export(server.url).json()["records"]
    assert carried["timing"]["median_ms"] == 1.1
    assert [b["name"] for b in carried["baselines"]] == ["torch_eager"]


# -- provenance: an import never raises trust, nor loses who measured what ----------------------


def _token(url: str, name: str, scope: str = "write", trusted: bool = False) -> str:
    answer = httpx.post(f"{url}/v1/tokens", json={"name": name, "scope": scope,
                                                  "trusted": trusted}, headers=AUTH, timeout=30)  # fmt: skip
    assert answer.status_code == 201, answer.text
    made: str = answer.json()["token"]
    return made


def _tunecache_as(token: str, *args: str) -> subprocess.CompletedProcess[str]:
    import os

    env = {**os.environ, "TUNECACHE_TOKEN": token}
    return subprocess.run([sys.executable, "-m", "tunecache_cli", *args], capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip


def _records_on(url: str) -> dict[int, Any]:
    """Every record on ``url`` by its key's ``M``, as the client reads them."""
    from tunecache.schemas import RecordPublic

    listed = httpx.get(f"{url}/v1/records", params={"limit": 100}, timeout=30).json()["items"]
    return {r["key"]["problem"]["M"]: RecordPublic.model_validate(r) for r in listed}


def _a_verified_and_a_pending_record(url: str) -> dict[int, Any]:
    """On ``url``: mallory's record at M=98 claiming 1000x over eager, which a verifier passed,
    timing it on another machine ("verifier-cpu"), and bob's at M=99, never verified."""
    from tests.test_best import with_eager
    from tunecache.verification import VerificationCreate

    key = make_key(98)
    with Client(url, token=_token(url, "mallory")) as client:
        record_id = client.upload(with_eager(key, 1.0, 1000.0, 1000.0)).record_id
    with Client(url, token=_token(url, "bob")) as client:
        client.upload(with_eager(make_key(99), 2.0, 200.0, 100.0))
    with Client(url, token=_token(url, "v", "verify")) as client:
        assert client.claim_verification("v1", device_arch=ARCH, backends=[key.backend])
        client.submit_verification(record_id, VerificationCreate(
            worker="v1", outcome="passed", device_name="verifier-cpu",
            timing=make_record(key, time_ms=1.1).timing,
            validation=make_record(key).validation))  # fmt: skip
    return _records_on(url)


@pytest.mark.slow
def test_an_import_keeps_who_measured_what_and_raises_no_trust(
    server: LiveServer, tmp_path: Path
) -> None:
    """Exported from A and imported into B by a trusted CI token, mallory's verified record
    read on B as "verified by ci-sync (trusted uploader) on <the key's device> (uploaded by
    ci-sync)", dated the import, its 1000x with no caveat; bob's never-verified record came back
    verified, and served under ``--policy verified``. Now each keeps what A knew of it."""
    from tunecache.timing import versus
    from tunecache.verification import trust_text

    on_a = _a_verified_and_a_pending_record(server.url)
    assert (on_a[98].status, on_a[99].status) == ("verified", "pending")
    out = tmp_path / "a.json"
    done = tunecache("snapshot", "export", "--arch", ARCH, "--server", server.url, "-o", str(out))
    assert done.returncode == 0, done.stderr

    db_path = tmp_path / "b.db"
    other = start_server(f"sqlite:///{db_path}", db_path, tmp_path / "b.log",
                         args=["--policy", "verified"])  # fmt: skip
    try:
        ci = _token(other.url, "ci-sync", trusted=True)
        done = _tunecache_as(ci, "snapshot", "import", str(out), "--server", other.url)
        assert done.returncode == 0, done.stderr
        on_b = _records_on(other.url)
        with Client(other.url) as client:
            found = {m: client.lookup(make_key(m), default=DEFAULT) for m in (98, 99)}
        served = {m: (hit.source, hit.rule) for m, hit in found.items()}
    finally:
        other.stop()
    verified, pending = on_b[98], on_b[99]
    by = verified.uploaded_by or ""
    held = {
        # (a) the speedup beside the verifier's time is still said to be the uploader's
        "a": "not re-timed by the verifier" in versus(verified),
        # (b) the verifier's time is the verifier's device's, not the key's
        "b": verified.timed_on == "verifier-cpu" and "on verifier-cpu" in trust_text(verified),
        # (c) mallory uploaded it; ci-sync imported it
        "c": by == "mallory, imported by ci-sync"
        and "uploaded by ci-sync" not in trust_text(verified),
        # (d) dated when it was uploaded, not when it was imported
        "d": (verified.created_at, pending.created_at)
        == (on_a[98].created_at, on_a[99].created_at),
        # (e) never verified on A: pending on B, even from a trusted importer, and not served
        "e": (verified.status, pending.status) == ("verified", "pending")
        and served[98] == ("server", "exact")
        and served[99] != ("server", "exact")
        and (verified.is_winner, pending.is_winner) == (True, False)
        and pending.uploaded_by == "bob, imported by ci-sync",
    }
    assert held == dict.fromkeys("abcde", True), (
        verified.status,
        pending.status,
        served,
        pending.uploaded_by,
    )


def test_a_speedup_the_verifiers_time_contradicts_is_not_exported(
    server: LiveServer, tmp_path: Path
) -> None:
    """Beside a verifier's time a snapshot carried the uploader's interleaved comparisons, which
    an import refuses where they contradict that time (a verifier on another machine timed the
    winner 10x faster: 1000x over eager's 1000 ms is no ratio of 0.1 ms). The whole import was a
    422; such a comparison is left out of the export instead."""
    from tests.test_best import with_eager
    from tunecache.verification import VerificationCreate

    key = make_key(97)
    with Client(server.url, token=_token(server.url, "mallory")) as client:
        record_id = client.upload(with_eager(key, 1.0, 1000.0, 1000.0)).record_id
    with Client(server.url, token=_token(server.url, "v", "verify")) as client:
        assert client.claim_verification("v1", device_arch=ARCH, backends=[key.backend])
        client.submit_verification(record_id, VerificationCreate(
            worker="v1", outcome="passed", device_name="verifier-cpu",
            timing=make_record(key, time_ms=0.1).timing,
            validation=make_record(key).validation))  # fmt: skip
    exported = httpx.get(f"{server.url}/v1/snapshot", headers=AUTH,
                         params={"device_arch": ARCH, "provenance": "true"})  # fmt: skip
    assert exported.status_code == 200, exported.text
    (record,) = exported.json()["records"]
    assert record["timing"]["median_ms"] == 0.1 and record["baselines"] == []
    db_path = tmp_path / "b.db"
    other = start_server(f"sqlite:///{db_path}", db_path, tmp_path / "b.log")
    try:
        ci = _token(other.url, "ci-sync", trusted=True)
        imported = httpx.post(f"{other.url}/v1/snapshot", content=exported.content,
                              headers={"Authorization": f"Bearer {ci}",
                                       "Content-Type": "application/json"})  # fmt: skip
        assert imported.status_code == 200, imported.text
        assert imported.json()["imported"] == 1
    finally:
        other.stop()


def test_an_untrusted_import_is_pending_and_names_uploader_and_importer(
    server: LiveServer, tmp_path: Path
) -> None:
    """A write token that is not trusted vouches for nothing: a record comes in pending, never
    "uploaded by" the importer, and one whose time a verifier re-timed not at all (it read as its
    uploader's own time, on the key's device, not the verifier's). Exported again, an imported
    record names no uploader: the name was its file's word, and one hop later read as the
    uploader's own, the importer gone."""
    from tunecache.verification import trust_text

    on_a = _a_verified_and_a_pending_record(server.url)
    exported = export(server.url, provenance="true").json()
    db_path = tmp_path / "b.db"
    other = start_server(f"sqlite:///{db_path}", db_path, tmp_path / "b.log")
    try:
        answer = httpx.post(f"{other.url}/v1/snapshot", json=exported, timeout=60,
                            headers={"Authorization": f"Bearer {_token(other.url, 'eve')}"})  # fmt: skip
        assert answer.status_code == 200, answer.text
        assert answer.json()["imported"] == 1
        on_b = _records_on(other.url)
        again = export(other.url, provenance="true").json()["provenance"]
    finally:
        other.stop()
    assert list(on_b) == [99] and on_b[99].status == "pending"
    assert on_b[99].uploaded_by == "bob, imported by eve"
    assert "uploaded by bob, imported by eve" in trust_text(on_b[99])
    assert on_b[99].created_at == on_a[99].created_at
    assert [entry.get("uploaded_by") for entry in again] == [None]


def test_a_date_ahead_of_the_clock_is_exported_read_and_imported_as_now(
    server: LiveServer, tmp_path: Path
) -> None:
    """A date past a host's clock (another host's clock runs ahead, or a file said so) failed
    every export of that host (500) and made a reader whose clock was behind ignore the whole
    file. Dates are read as they are; an import takes one past its own time as its own time."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update

    from cache_server.db import make_engine
    from cache_server.models import RecordRow

    _a_verified_and_a_pending_record(server.url)
    ahead = datetime.now(UTC) + timedelta(days=2)
    engine = make_engine(server.db)
    with engine.begin() as db:
        db.execute(update(RecordRow).values(created_at=ahead))
    engine.dispose()
    exported = export(server.url, provenance="true")
    assert exported.status_code == 200, exported.text
    path = tmp_path / "ahead.json"
    path.write_bytes(exported.content)
    assert len(load_snapshot(path).records) == 2  # read whole, as it is
    assert export(server.url).status_code == 200  # sync's form too
    db_path = tmp_path / "b.db"
    other = start_server(f"sqlite:///{db_path}", db_path, tmp_path / "b.log")
    try:
        ci = _token(other.url, "ci-sync", trusted=True)
        answer = httpx.post(f"{other.url}/v1/snapshot", content=exported.content, timeout=60,
                            headers={"Authorization": f"Bearer {ci}",
                                     "Content-Type": "application/json"})  # fmt: skip
        assert answer.status_code == 200, answer.text
        on_b = _records_on(other.url)
    finally:
        other.stop()
    assert all(r.created_at < ahead - timedelta(days=1) for r in on_b.values())


def test_an_old_snapshot_without_provenance_imports_pending_stated_by_nobody(
    server: LiveServer,
) -> None:
    """A file of the format before provenance still imports; it states no one's word, so even a
    trusted importer's copy is pending, its uploader unnamed, its importer named."""
    ci = _token(server.url, "ci-sync", trusted=True)
    old = document(make_record(make_key(64), time_ms=1.0))
    answer = httpx.post(f"{server.url}/v1/snapshot", json=old, timeout=60,
                        headers={"Authorization": f"Bearer {ci}"})  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.json()["imported"] == 1
    [record] = _records_on(server.url).values()
    assert record.status == "pending"
    assert record.uploaded_by is not None and "imported by ci-sync" in record.uploaded_by
    assert not record.uploaded_by.startswith("ci-sync")


def _stated(records: int = 1, **changes: Any) -> dict[str, Any]:
    entry = {"status": "pending", "uploaded_by": "bob", "created_at": "2026-01-02T03:04:05Z",
             "uploaders": ["timing", "torch_eager"], **changes}  # fmt: skip
    return {
        **document(*[make_record(make_key(64 + i)) for i in range(records)]),
        "provenance": [entry] * records,
    }


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({**_stated(2), "provenance": _stated(1)["provenance"]}, "provenance"),
        (_stated(status="verified"), "verification"),
        (_stated(status="disputed"), "status"),
        (_stated(uploaded_by="x, imported by alice"), "uploaded_by"),
        (_stated(created_at="2026-01-02T03:04:05"), "created_at"),
        (_stated(created_at="0001-01-01T00:00:00+01:00"), "created_at"),  # was a 500
        (_stated(created_at="9999-12-31T23:59:59-01:00"), "created_at"),
        (_stated(created_at="0"), "created_at"),  # was a Unix time: 1970
        (_stated(created_at="-1"), "created_at"),  # 1969
        (_stated(created_at=0), "created_at"),
        (_stated(uploaders=["torch_eager"]), "uploaders"),
        (_stated(uploaders=["timing", "made_up", "torch_eager"]), "uploaders"),
        (
            _stated(
                status="verified",
                verification={
                    "verifier": "v",
                    "device_name": "d",
                    "verified_at": "2026-01-03T00:00:00Z",
                    "retimed": True,
                },
            ),
            "uploader_timing",
        ),
    ],
)
def test_bad_provenance_is_a_422_naming_it_and_stores_nothing(
    shared_server: LiveServer, body: dict[str, Any], named: str
) -> None:
    before = record_count(shared_server.url)
    answer = import_(shared_server.url, body)
    assert answer.status_code == 422, answer.text
    assert named in answer.json()["detail"]
    assert record_count(shared_server.url) == before


def test_a_stated_date_before_2000_is_taken_as_2000() -> None:
    """No record is as old: an importer stated records made in 1969 or in year 1. Taken as
    2000, not refused: a server that imported such a record before could no longer export."""
    from tunecache.snapshot_provenance import EARLIEST, StatedVerification

    for said in ("1969-12-31T23:59:59Z", "0001-01-02T00:00:00Z", "2000-01-01T01:59:59+02:00"):
        stated = StatedVerification.model_validate({
            "verifier": "v", "device_name": "d", "verified_at": said, "retimed": False})  # fmt: skip
        assert stated.verified_at == EARLIEST, said


def test_a_stated_date_is_read_in_utc() -> None:
    """Every timestamp the API sends is UTC: a verifier's date stated at ``+23:59`` was stored
    and served so."""
    from datetime import UTC, datetime

    from tunecache.snapshot_provenance import StatedVerification

    stated = StatedVerification.model_validate({
        "verifier": "v", "device_name": "d", "verified_at": "2026-06-01T12:00:00+23:59",
        "retimed": False})  # fmt: skip
    assert stated.verified_at.tzinfo is UTC
    assert stated.verified_at == datetime(2026, 5, 31, 12, 1, tzinfo=UTC)


def test_cli_import_of_a_file_with_bad_provenance_exits_2_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_stated(status="verified")))
    done = tunecache("snapshot", "import", str(path), "--server", "http://127.0.0.1:9")
    assert done.returncode == 2, done.stderr
    assert "verification" in done.stderr and "Traceback" not in done.stderr


def test_a_stated_name_no_token_could_take_is_shown_quoted(server: LiveServer) -> None:
    """A snapshot stated its uploader and verifier as "\u0430dmin1   w1" and "\u0430dmin1 (trusted
    uploader)" (a Cyrillic а, spaces HTML collapses), names no new token may take: a trusted
    import showed the record "verified by аdmin1" on the dashboard, read as the team's admin1.
    Such a name is shown quoted in ASCII, as a device's name is."""
    from tunecache.verification import trust_text

    ci = _token(server.url, "ci-sync", trusted=True)
    check = {"verifier": "\u0430dmin1 (trusted uploader)", "device_name": CPU.name,
             "verified_at": "2026-01-02T03:04:05Z", "retimed": False}  # fmt: skip
    body = _stated(status="verified", uploaded_by="\u0430dmin1   w1", verification=check)
    answer = httpx.post(f"{server.url}/v1/snapshot", json=body, timeout=60,
                        headers={"Authorization": f"Bearer {ci}"})  # fmt: skip
    assert answer.status_code == 200 and answer.json()["imported"] == 1, answer.text
    [record] = _records_on(server.url).values()
    assert record.status == "verified"
    assert record.uploaded_by == '"\\u0430dmin1   w1", imported by ci-sync'
    assert 'verified by "\\u0430dmin1" (trusted uploader) on ' in trust_text(record)
    for page in ("/", f"/ui/records/{record.id}"):
        html = httpx.get(f"{server.url}{page}", timeout=30).text
        assert "\u0430" not in html and "&#34;\\u0430dmin1&#34; (trusted uploader)" in html, page


def test_an_import_that_leaves_out_what_a_verifier_re_timed_says_why(
    server: LiveServer, tmp_path: Path
) -> None:
    """A write token's import of a verified server's snapshot (every record re-timed by its
    verifier) said "imported 0 records ... 0 winners changed" and exited 0, giving no reason:
    a server stores a re-timed record from a trusted token's import only. It says so."""
    record = make_record(make_key(64), time_ms=1.0)
    timing = record.model_dump(mode="json", by_alias=True)["timing"]
    stated = _stated(status="verified", uploader_timing=timing, uploaders=["torch_eager"],
                     verification={"verifier": "v", "device_name": "d",
                                   "verified_at": "2026-01-03T00:00:00Z", "retimed": True})  # fmt: skip
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(stated))
    untrusted = _tunecache_as(_token(server.url, "w"), "snapshot", "import", str(path),
                              "--server", server.url)  # fmt: skip
    assert untrusted.returncode == 0, untrusted.stderr
    assert "imported 0 records" in untrusted.stdout, untrusted.stdout
    assert "1 record of" in untrusted.stderr and "trusted token's import only" in untrusted.stderr
    trusted = _tunecache_as(_token(server.url, "ci", trusted=True), "snapshot", "import",
                            str(path), "--server", server.url)  # fmt: skip
    assert "imported 1 record" in trusted.stdout and "re-timed" not in trusted.stderr
