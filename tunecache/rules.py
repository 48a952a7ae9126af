"""Lookup rules as pure functions: which tuned winner may serve a key, and which serves it best.

The server (after its SQL pre-filter), snapshot files (offline) and warm starts all decide with
:func:`match` and :func:`best`, on keys as JSON (:meth:`tunecache.Key.to_json`):

* ``exact``: the same key;
* ``same_arch``: the same problem on another device of the same arch;
* ``bucket``: the nearest problem in the key's shape bucket (the kernel's bucket dimensions
  rounded up to a power of two, the others equal), on the same arch. Whose bucket dimensions:
  the caller's kernel's (``buckets``); by default this process's registration of the kernel.

Always the same kernel, source hash, backend and dtype, and environment versions the caller's
version policy admits. Of several, the better rule wins, then the nearer shape, then the nearer
device size.

Example:
    >>> from tunecache import key_for
    >>> wanted = key_for("matmul", "tvm", {"M": 3000, "N": 64, "K": 64}, "float32").to_json()
    >>> tuned = {**wanted, "problem": {"K": 64, "M": 4096, "N": 64}}
    >>> match(wanted, tuned, "strict")
    'bucket'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from tunecache.policies import (
    BucketPolicy,
    VersionPolicy,
    bucket_policy,
    server_bucket,
    shape_distance,
    versions_match,
    widest_bucket,
)

Rule = Literal["exact", "same_arch", "bucket"]
RULES: tuple[Rule, ...] = ("exact", "same_arch", "bucket")
T = TypeVar("T")
_SAME = ("kernel", "source_hash", "backend", "dtype")


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON: in Python ``True == 1`` and ``64 == 64.0``, but a flag is not a size and
    JSON's ``64.0`` is not ``64`` (what :func:`~tunecache.canonical.canonical_json` tells apart),
    compared without serialising (a bucket lookup compares dozens of candidates)."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if type(a) is list:
        return len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


@dataclass(frozen=True)
class _Wanted:
    """What matching reads of the wanted key, computed once for all its candidates."""

    key: Mapping[str, Any]
    buckets: BucketPolicy
    bucket: dict[str, Any]

    @classmethod
    def of(cls, key: Mapping[str, Any], buckets: BucketPolicy | None = None) -> _Wanted:
        if buckets is None:
            buckets = bucket_policy(key["kernel"])
        return cls(key, buckets, buckets.bucket(key["problem"]))


def match(
    wanted: Mapping[str, Any], tuned: Mapping[str, Any], policy: VersionPolicy,
    buckets: BucketPolicy | None = None,
) -> Rule | None:  # fmt: skip
    """The rule by which a winner tuned for key ``tuned`` may serve key ``wanted``, or ``None``
    (``buckets``: the wanted kernel's bucket policy; by default its registration here)."""
    return _match(_Wanted.of(wanted, buckets), tuned, policy)


def _match(prepared: _Wanted, tuned: Mapping[str, Any], policy: VersionPolicy) -> Rule | None:
    wanted = prepared.key
    if any(wanted[f] != tuned[f] for f in _SAME):
        return None
    if wanted["device"]["arch"] != tuned["device"]["arch"]:
        return None
    if not versions_match(wanted["environment"], tuned["environment"], policy):
        return None
    if _same(tuned["problem"], wanted["problem"]):
        return "exact" if _same(tuned["device"], wanted["device"]) else "same_arch"
    if prepared.buckets.dims and _same(prepared.buckets.bucket(tuned["problem"]),
                                       prepared.bucket):  # fmt: skip
        return "bucket"
    return None


def closeness(wanted: Mapping[str, Any], tuned: Mapping[str, Any]) -> tuple[float, int]:
    """How far ``tuned`` is from ``wanted``: shape distance, then device size difference."""
    units = abs(int(tuned["device"]["units"]) - int(wanted["device"]["units"]))
    return shape_distance(wanted["problem"], tuned["problem"]), units


def best(
    wanted: Mapping[str, Any], candidates: Iterable[tuple[Mapping[str, Any], T]],
    policy: VersionPolicy, buckets: BucketPolicy | None = None,
) -> tuple[T, Rule] | None:  # fmt: skip
    """The candidate (a tuned key and its payload) that serves ``wanted`` best, and its rule
    (``buckets`` as for :func:`match`)."""
    ranked: list[tuple[int, float, int, int, T, Rule]] = []
    prepared = _Wanted.of(wanted, buckets)
    for order, (tuned, payload) in enumerate(candidates):
        rule = _match(prepared, tuned, policy)
        if rule is not None:
            ranked.append((RULES.index(rule), *closeness(wanted, tuned), order, payload, rule))
    if not ranked:
        return None
    *_, payload, rule = min(ranked, key=lambda r: r[:4])
    return payload, rule


def bucket_digest(key: Mapping[str, Any]) -> str:
    """What every key a winner of ``key`` may serve by a rule shares, hashed: kernel, source,
    backend, dtype, arch and the problem rounded to its bucket: a built-in kernel's
    (:func:`~tunecache.policies.server_bucket`); any other's widest
    (:func:`~tunecache.policies.widest_bucket`: a server does not know a user's kernel's bucket,
    and that one holds the bucket mates of whatever dimensions a caller rounds). The server
    indexes winners by it, so a lookup reads a handful of rows, however many winners the cache
    holds."""
    from tunecache.canonical import digest

    buckets = server_bucket(key["kernel"])
    problem = key["problem"]
    bucket = widest_bucket(problem) if buckets is None else buckets.bucket(problem)
    shared = {f: key[f] for f in _SAME}
    return digest({**shared, "arch": key["device"]["arch"], "bucket": bucket})
