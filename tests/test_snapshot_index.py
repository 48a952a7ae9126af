"""The snapshot's index answers exactly what a scan of every record answers, for every rule and
version policy, and a snapshot's records validated on first use are the ones a whole load keeps."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from pathlib import Path
from typing import Any

import pytest

from tests.factories import CPU, knobs, make_key, make_record
from tunecache import InvalidInput, RecordsSource, Resolver, SnapshotSource
from tunecache.key import Key
from tunecache.policies import EXACT, VERSION_POLICIES, BucketPolicy
from tunecache.record_index import RecordIndex
from tunecache.rules import best
from tunecache.schemas import RecordCreate
from tunecache.snapshot import (
    SNAPSHOT_FORMAT,
    SnapshotFilters,
    index_snapshot,
    load_snapshot,
    render_snapshot,
)
from tunecache.snapshot_index import key_json, load_snapshot_index
from tunecache.snapshot_provenance import RecordProvenance

ARCH = "cpu-avx2"


def random_key(rng: random.Random) -> dict[str, Any]:
    """A key as JSON, drawn from few values of each field so that every rule matches often; the
    problem's values include what only JSON tells apart (``64`` and ``64.0``, ``1`` and
    ``True``) and what equals without being the same (``0.0`` and ``-0.0``)."""
    return {
        "schema": 1,
        "kernel": rng.choice(["matmul", "softmax", "user_kernel"]),
        "source_hash": rng.choice(["0123456789abcdef", "fedcba9876543210"]),
        "backend": rng.choice(["tvm", "inductor"]),
        "problem": {
            "M": rng.choice([1, 3, 4, 5, 8, 48, 64, 64.0, 100, 128, True]),
            "N": rng.choice([64, 64, 64.0, 1, True, 0.0, -0.0, [1, 2], {"a": 1}]),
            **({"K": rng.choice([16, 32])} if rng.random() < 0.3 else {}),
        },
        "dtype": rng.choice(["float32", "float16"]),
        "device": {
            "kind": "cpu",
            "arch": rng.choice(["cpu-avx2", "cpu-avx512"]),
            "name": rng.choice(["a", "b"]),
            "units": rng.choice([2, 8, 64]),
            "memory_gb": 0,
            "flags": [],
        },
        "environment": rng.choice(
            [{"apache-tvm": "0.27.0"}, {"apache-tvm": "0.27.1"}, {"apache-tvm": "0.28.0"}, {}]
        ),
    }


@pytest.mark.parametrize("seed", range(4))
def test_the_index_answers_what_a_scan_of_every_record_answers(seed: int) -> None:
    rng = random.Random(seed)
    entries = [(random_key(rng), f"record {i}") for i in range(400)]
    index = RecordIndex(entries)
    policies = [None, EXACT, BucketPolicy(("M",)), BucketPolicy(("M", "N")), BucketPolicy(("K",))]
    rules = set()
    for _ in range(300):
        wanted = random_key(rng) if rng.random() < 0.5 else dict(rng.choice(entries)[0])
        for policy in VERSION_POLICIES:
            for buckets in policies:
                expected = best(wanted, entries, policy, buckets)
                assert index.best(wanted, policy, buckets) == expected, (wanted, policy, buckets)
                rules.add(None if expected is None else expected[1])
    assert rules == {None, "exact", "same_arch", "bucket"}  # every rule was compared


def test_records_source_answers_as_a_scan_for_every_rule() -> None:
    """Through the resolver: the nearest bucket mate, the same problem on another device, a
    tie broken by the records' order, exactly as before the index."""
    records = [make_record(make_key(m), config=knobs(m % 64 + 1)) for m in (48, 64, 40, 128)]
    records.append(make_record(make_key(48), config=knobs(63)))  # a tie: the first wins
    resolver = Resolver([RecordsSource(records)])
    other = dataclasses.replace(CPU, name="another", units=16)
    candidates = [(r.key.model_dump(mode="json", by_alias=True), r) for r in records]
    for m in (40, 44, 48, 50, 64, 100, 128, 200):
        for key in (make_key(m), dataclasses.replace(make_key(m), device=other)):
            found = best(key.to_json(), candidates, "strict")
            answer = resolver.resolve(key)
            assert answer.config == (None if found is None else found[0].config), (m, key)
            assert answer.rule == (None if found is None else found[1])


def keys_of_many_groups(sizes: tuple[int, ...] = (8, 40, 48, 64, 100, 128)) -> list[Key]:
    return [
        dataclasses.replace(make_key(m, kernel=kernel, backend=backend, dtype=dtype), device=d)
        for m in sizes
        for kernel, backend in (("matmul", "tvm"), ("softmax", "tvm"), ("layernorm", "inductor"))
        for dtype in ("float32", "float16")
        for d in (CPU, dataclasses.replace(CPU, name="other", units=8))
    ]


def write(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(json.dumps(document))
    return path


def snapshot_document(records: list[RecordCreate]) -> dict[str, Any]:
    body, _ = render_snapshot(SnapshotFilters(device_arch=ARCH), records)
    document: dict[str, Any] = json.loads(body)
    return document


def answers(source: SnapshotSource | RecordsSource, keys: list[Key]) -> list[Any]:
    resolver = Resolver([source])
    return [(a.source, a.rule, a.config) for a in map(resolver.resolve, keys)]


def test_a_snapshot_read_group_by_group_answers_as_one_validated_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Duplicates (the faster wins), unvalidated records, records that do not validate (left
    out with one warning each time a group holds some) and records validated at once (a name
    not plain): the answers are those of the records a whole load keeps."""
    keys = keys_of_many_groups()
    rng = random.Random(7)
    records = [make_record(k, time_ms=rng.choice([1.0, 2.0]), config=knobs(rng.randint(1, 64))
                           if k.backend == "tvm" else None, passed=rng.random() < 0.9)
               for k in keys for _ in range(2)]  # fmt: skip
    document = snapshot_document(records)
    document["records"][3]["config"] = {"schedule": "knobs", "tile_i": "huge"}  # not valid
    document["records"][5]["key"]["device"]["arch"] = "cpu avx2"  # not valid, nor plain
    document["records"][9]["key"]["kernel"] = ["matmul"]  # not valid, nor plain
    path = write(tmp_path / "winners.json", document)
    keys += keys_of_many_groups((7, 50, 120, 200))  # bucket mates, and misses
    with caplog.at_level(logging.WARNING):
        whole = load_snapshot(path)
    assert len(whole.records) == len(records) - 3
    expected = answers(RecordsSource(index_snapshot(whole).values()), keys)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        got = answers(SnapshotSource(path), keys)
    assert got == expected
    assert {a[1] for a in got} == {"exact", "same_arch", "bucket", None}
    left_out = " ".join(r.getMessage() for r in caplog.records)
    assert all(f"records[{i}]" in left_out for i in (3, 5, 9))
    index = load_snapshot_index(path)
    for key in keys:  # the same records, each validated as a whole load validates it
        found = index.best(key.to_json(), "strict")
        scan = best(key.to_json(), [(key_json(r), r) for r in index_snapshot(whole).values()],
                    "strict")  # fmt: skip
        assert found == scan


@pytest.mark.parametrize("change", ["arch", "kernel-filter", "schema"])
def test_whole_file_problems_still_refuse_the_whole_file_with_the_same_words(
    tmp_path: Path, change: str
) -> None:
    records = [make_record(k) for k in keys_of_many_groups()[:6]]
    document = snapshot_document(records)
    if change == "arch":  # a valid record of another arch
        document["records"][2]["key"]["device"]["arch"] = "cpu-avx512"
    elif change == "kernel-filter":
        document["filters"]["kernel"] = "softmax"
    else:
        document["format"] = "tunecache-snapshot/2"
    path = write(tmp_path / "winners.json", document)
    with pytest.raises(InvalidInput) as whole:
        load_snapshot(path)
    with pytest.raises(InvalidInput) as indexed:
        load_snapshot_index(path)
    assert str(indexed.value) == str(whole.value)


def test_a_snapshot_stating_provenance_answers_as_before(tmp_path: Path) -> None:
    keys = keys_of_many_groups()[:12]
    records = [make_record(k, config=knobs(i + 1) if k.backend == "tvm" else None)
               for i, k in enumerate(keys)]  # fmt: skip
    provenance = [RecordProvenance.model_validate({"status": "pending", "uploaders": ["timing", "torch_eager"],
                                                   "created_at": "2026-01-01T00:00:00Z"})
                  for _ in records]  # fmt: skip
    body, _ = render_snapshot(SnapshotFilters(device_arch=ARCH), records, provenance)
    path = tmp_path / "winners.json"
    path.write_bytes(body)
    assert json.loads(body)["format"] == SNAPSHOT_FORMAT
    expected = answers(RecordsSource(index_snapshot(load_snapshot(path)).values()), keys)
    assert answers(SnapshotSource(path), keys) == expected
    assert {a[0] for a in expected} == {"snapshot"}


def test_a_newer_versions_fields_are_left_out_by_both_loaders_alike(tmp_path: Path) -> None:
    """A file a newer tunecache wrote, with fields this one does not know (at the top, in its
    filters, in a record): both loaders leave them out and answer the same (a newer field that
    must be understood comes with a new format)."""
    keys = keys_of_many_groups()[:6]
    records = [make_record(k) for k in keys]
    document = snapshot_document(records)
    document["signed_by"] = "ci"
    document["filters"]["note"] = "nightly"
    document["records"][2]["timing"]["cycles"] = 2**70
    path = write(tmp_path / "winners.json", document)
    whole = load_snapshot(path)
    assert [r.config for r in whole.records] == [r.config for r in records]
    index = load_snapshot_index(path)
    for key in keys:
        scan = best(key.to_json(), [(key_json(r), r) for r in index_snapshot(whole).values()],
                    "strict")  # fmt: skip
        assert index.best(key.to_json(), "strict") == scan
