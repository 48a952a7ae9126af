"""Lookup rules and version policies, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from cache_server.db import make_engine, make_sessionmaker
from cache_server.lookup import find_winner
from cache_server.migrate import upgrade
from cache_server.queries import add_record
from tests.factories import CPU, knobs, make_record
from tunecache.device import DeviceFingerprint
from tunecache.key import Key
from tunecache.policies import bucket_policy, next_power_of_two, versions_match
from tunecache.schemas import KeyModel

pytestmark = pytest.mark.slow
OTHER_CPU = DeviceFingerprint(kind="cpu", arch="cpu-avx2", name="other-cpu", units=8)
THIRD_CPU = DeviceFingerprint(kind="cpu", arch="cpu-avx2", name="third-cpu", units=6)
OTHER_ARCH = DeviceFingerprint(kind="cpu", arch="cpu-avx512", name="test-cpu", units=2)


def key(m: int = 64, n: int = 64, *, device: DeviceFingerprint = CPU, tvm: str = "0.27.0") -> Key:
    return Key(kernel="matmul", source_hash="abcd", backend="tvm", problem={"M": m, "N": n, "K": 64},
               dtype="float32", device=device, environment={"apache-tvm": tvm})  # fmt: skip


@pytest.fixture
def session(database: tuple[str, Path | None]) -> Iterator[Session]:
    url, _ = database
    upgrade(url)
    with make_sessionmaker(make_engine(url))() as s:
        yield s


def store(
    session: Session, k: Key, ms: float, *, passed: bool = True, config: dict | None = None
) -> int:
    record = make_record(k, time_ms=ms, passed=passed, config=config)
    record_id, *_ = add_record(session, key_hash=k.digest(), record=record)
    session.commit()
    return record_id


def lookup(
    session: Session, k: Key, policy: str = "strict", bucket: list[str] | None = None
) -> tuple[int, str] | None:
    found = find_winner(session, key=KeyModel.from_key(k), policy=policy,  # type: ignore[arg-type]
                        bucket=bucket)  # fmt: skip
    return None if found is None else (found[0].id, found[1])


def test_rules_in_order(session: Session) -> None:
    bucket_mate = store(session, key(m=100), 1.0)  # M=100 buckets with 65..128
    other_device = store(session, key(m=96, device=OTHER_CPU), 1.0)
    exact = store(session, key(m=96), 2.0)
    assert lookup(session, key(m=96)) == (exact, "exact")
    assert lookup(session, key(m=96, device=OTHER_CPU)) == (other_device, "exact")
    # Another device of the arch: the record from the device with the nearest core count.
    assert lookup(session, key(m=96, device=THIRD_CPU)) == (other_device, "same_arch")
    assert lookup(session, key(m=120)) == (bucket_mate, "bucket")  # nearest shape of the bucket
    assert lookup(session, key(m=97, device=OTHER_CPU))[1] == "bucket"  # type: ignore[index]
    assert lookup(session, key(m=200)) is None  # the next bucket
    assert lookup(session, key(m=96, n=128)) is None  # only M is bucketed
    assert lookup(session, key(m=96, device=OTHER_ARCH)) is None  # never across architectures


def test_nearest_bucket_mate_wins(session: Session) -> None:
    far = store(session, key(m=65), 0.5)
    near = store(session, key(m=120), 3.0)
    assert lookup(session, key(m=128)) == (near, "bucket")
    assert far != near


def test_a_flag_never_matches_a_size(session: Session) -> None:
    def with_x(x: object, device: DeviceFingerprint = CPU) -> Key:
        problem = {"M": 64, "N": 64, "K": 64, "x": x}  # a user's kernel: it may take a flag
        return Key(kernel="tests.flags:Kernel", source_hash="abcd", backend="tvm", problem=problem,
                   dtype="float32", device=device, environment={"apache-tvm": "0.27.0"})  # fmt: skip

    sized = store(session, with_x(1, device=OTHER_CPU), 1.0)
    assert lookup(session, with_x(1)) == (sized, "same_arch")
    assert lookup(session, with_x(True)) is None  # True == 1 in Python, not in a key


def test_a_users_kernel_is_bucketed_by_its_callers_dimensions(session: Session) -> None:
    """A server never imports a user's kernel, so it cannot know its bucket: the caller says it
    (``LookupRequest.bucket``), and the server's index finds the bucket mates whichever
    dimensions a caller rounds."""

    def affine(m: int, n: int = 64, device: DeviceFingerprint = CPU) -> Key:
        return Key(kernel="mypkg.kernels:Affine", source_hash="abcd", backend="tvm",
                   problem={"M": m, "N": n}, dtype="float32", device=device,
                   environment={"apache-tvm": "0.27.0"})  # fmt: skip

    tuned = store(session, affine(100), 1.0)
    assert lookup(session, affine(120)) is None  # the server's own registration: exact shapes
    assert lookup(session, affine(120), bucket=["M"]) == (tuned, "bucket")
    assert lookup(session, affine(120, device=OTHER_CPU), "compatible", ["M"]) == (tuned, "bucket")
    assert lookup(session, affine(120, n=60), bucket=["M"]) is None  # N is not rounded
    assert lookup(session, affine(120, n=60), bucket=["M", "N"]) == (tuned, "bucket")
    assert lookup(session, affine(200), bucket=["M"]) is None  # the next bucket
    # A built-in kernel's bucket is the server's own, whatever a caller says: no wider.
    built_in = store(session, key(m=100), 1.0)
    assert lookup(session, key(m=120), bucket=[]) == (built_in, "bucket")
    assert lookup(session, key(m=100, n=100), bucket=["M", "N"]) is None


def test_unvalidated_records_never_serve(session: Session) -> None:
    store(session, key(m=96), 0.1, passed=False)
    assert lookup(session, key(m=96)) is None
    assert lookup(session, key(m=100)) is None


@pytest.mark.parametrize("finding", ["disputed", "rejected"])
def test_a_winner_taken_out_of_service_as_the_lookup_reads_it_is_not_served(
    session: Session, database: tuple[str, Path | None], monkeypatch: pytest.MonkeyPatch,
    finding: str,
) -> None:  # fmt: skip
    """A lookup by another rule than the exact key's reads the bucket's winners, then the one it
    chose, in statements of their own: a dispute (or a verifier's rejection) committed between
    them answered the lookup with a record out of service (a reviewer's race: 52 lookups in
    1,553 on PostgreSQL). It reads the bucket again: the finding made the nearer key's second
    record its winner, which it serves (not the farther key's, as ranking what it had read
    did)."""
    import cache_server.lookup as module
    from cache_server import trust
    from cache_server.models import RecordRow
    from tests.test_trust import dispute_body
    from tunecache.verification import DisputeCreate

    # Both of the asking CPU's arch: the nearer in size (6 units to its 2, against 8) is chosen.
    near, far = (
        store(session, key(device=THIRD_CPU), 1.0),
        store(session, key(device=OTHER_CPU), 1.0),
    )
    second = store(session, key(device=THIRD_CPU), 2.0, config=knobs(2))
    others, read = make_sessionmaker(make_engine(database[0])), module.refused_at
    found: list[str] = []

    def out_of_service_meanwhile(reading: Session, key_hash: str) -> set[str]:
        if found:
            return read(reading, key_hash)
        found.append(finding)
        with others() as other:  # another request's finding, committed between the two reads
            if finding == "disputed":
                body = DisputeCreate.model_validate(dispute_body(key(device=THIRD_CPU)))
                trust.add_dispute(other, record_id=near, reporter="someone", dispute=body)
            else:
                row = other.get(RecordRow, near)
                assert row is not None
                row.status = "rejected"
                other.flush()
                trust.recompute_winners(other, key_hash=row.key_hash)
            other.commit()
        return read(reading, key_hash)

    monkeypatch.setattr(module, "refused_at", out_of_service_meanwhile)
    assert lookup(session, key()) == (second, "same_arch") and found == [finding]
    monkeypatch.setattr(module, "refused_at", read)
    assert lookup(session, key()) == (second, "same_arch")  # as the next lookup reads it
    assert far not in (near, second)


def test_version_policies(session: Session) -> None:
    tuned = store(session, key(m=96, tvm="0.27.0"), 1.0)
    patch, minor = key(m=96, tvm="0.27.1"), key(m=96, tvm="0.28.0")
    assert lookup(session, patch, "strict") is None
    assert lookup(session, patch, "compatible") == (tuned, "exact")
    assert lookup(session, minor, "compatible") is None
    assert lookup(session, minor, "any") == (tuned, "exact")


def test_policy_functions() -> None:
    assert [next_power_of_two(n) for n in (1, 2, 3, 64, 65, 4096)] == [1, 2, 4, 64, 128, 4096]
    assert bucket_policy("softmax").bucket({"M": 3, "N": 100}) == {"M": 4, "N": 100}
    assert not versions_match(
        {"torch": "2.11.0"}, {"torch": "2.11.0", "triton": "3.6"}, "compatible"
    )
    assert versions_match({"torch": "2.11.0+cu130"}, {"torch": "2.11.2"}, "compatible")


def test_rules_and_policies_through_the_server_and_client(server) -> None:  # type: ignore[no-untyped-def]
    from tunecache.client import Client

    with Client(server.url) as client:
        client.upload(make_record(key(m=100), time_ms=1.0))
    import httpx

    answer = httpx.post(f"{server.url}/v1/lookup", json={"key": key(m=120).to_json()}).json()
    assert (answer["match"], answer["policy"]) == ("bucket", "strict")
    newer = key(m=100, tvm="0.27.9")
    assert httpx.post(f"{server.url}/v1/lookup", json={"key": newer.to_json()}).status_code == 404
    stray = httpx.post(f"{server.url}/v1/lookup", json={"key": key().to_json(), "bucket": ["Q"]})
    assert stray.status_code == 422 and "bucket names ['Q']" in stray.text

    with Client(server.url, policy="compatible") as client:
        result = client.lookup(newer)
        again = client.lookup(newer)
        bucketed = client.lookup(key(m=120))
    assert result.source == "server" and result.record is not None
    # The rule and the policy that matched reach the caller, from the memo too.
    assert (result.rule, result.policy) == ("exact", "compatible")
    assert (again.source, again.rule, again.policy) == ("memo", "exact", "compatible")
    assert (bucketed.rule, bucketed.policy) == ("bucket", "compatible")
    bad = httpx.post(f"{server.url}/v1/lookup", json={"key": newer.to_json(), "policy": "loose"})
    assert bad.status_code == 422


def test_a_users_kernel_is_served_from_its_bucket_through_the_client(server) -> None:  # type: ignore[no-untyped-def]
    """The client sends its kernel's bucket: a user's kernel declaring ``bucket = ("M",)`` is
    served at a shape of the bucket it was not tuned at, as ``get --explain`` says it would be
    (the server, which never imports it, served only the exact shape)."""
    from tunecache import key_for
    from tunecache.client import Client
    from tunecache.schemas import CheckModel
    from tunecache.verification import DisputeCreate

    affine = "tests.user_kernels:AffineRows"
    tuned = key_for(affine, "tvm", {"M": 100, "N": 24}, "float32")
    wanted = key_for(affine, "tvm", {"M": 120, "N": 24}, "float32")
    with Client(server.url) as client:
        stored = client.upload(make_record(tuned, time_ms=1.0))
        hit = client.lookup(wanted)
        assert (hit.source, hit.rule, hit.problem) == ("server", "bucket", {"M": 100, "N": 24})
        assert hit.record is not None and hit.record.id == stored.record_id
        assert not client.lookup(key_for(affine, "tvm", {"M": 120, "N": 32}, "float32")).hit
        # Where it was served, it may be disputed (the server does not know its bucket).
        failed = CheckModel.raised(wanted.problem, 0, "wrong at M=120")
        disputed = client.dispute(stored.record_id, DisputeCreate(problem=wanted.problem,
                                                                  check=failed))  # fmt: skip
        assert disputed.status == "disputed"


def test_a_users_kernel_named_without_a_module_says_its_bucket_too(server) -> None:  # type: ignore[no-untyped-def]
    """What tells a user's kernel is that the server does not know it, not a ``:`` in its
    name: one registered as ``my_affine`` with ``bucket = ("M",)`` is served from its bucket."""
    from tunecache import key_for
    from tunecache.client import Client
    from tunecache.kernels import KernelSpec, register

    register(KernelSpec(name="tests_affine_rows", params=("M", "N"), inputs=(("M", "N"),),
                        output=("M", "N"), dtypes={"tvm": ("float32",)}, bucket=("M",)))  # fmt: skip
    tuned = key_for("tests_affine_rows", "tvm", {"M": 100, "N": 24}, "float32")
    with Client(server.url) as client:
        client.upload(make_record(tuned, time_ms=1.0))
        hit = client.lookup(key_for("tests_affine_rows", "tvm", {"M": 120, "N": 24}, "float32"))
    assert (hit.source, hit.rule) == ("server", "bucket")


def test_a_server_older_than_the_bucket_field_still_serves_every_key() -> None:
    """A server that refuses the field as unknown (a 422 naming ``body.bucket``) is asked again
    without it, and not again with it: it serves a user's kernel at exact shapes, as it did,
    and is not taken for a server that is down (which skipped it for every key)."""
    import json

    import httpx

    from tests.factories import miss
    from tunecache import key_for
    from tunecache.client import Client
    from tunecache.http import IDENTITY_HEADER

    bodies: list[dict[str, object]] = []

    def old_server(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        if "bucket" in body:
            error = {"loc": ["body", "bucket"], "msg": "Extra inputs are not permitted",
                     "type": "extra_forbidden"}  # fmt: skip
            return httpx.Response(422, json={"status": 422, "detail": "body.bucket: Extra inputs "
                                             "are not permitted", "errors": [error]},
                                  headers={IDENTITY_HEADER: "tunecache/0.0.9"})  # fmt: skip
        return miss()

    affine = "tests.user_kernels:AffineRows"
    with Client("http://old.test", transport=httpx.MockTransport(old_server)) as client:
        for m in (120, 121):
            answer = client.fetch_answer(key_for(affine, "tvm", {"M": m, "N": 24}, "float32"))
            assert answer is None  # a miss, not a failure
    assert ["bucket" in body for body in bodies] == [True, False, False]
