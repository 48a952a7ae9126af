"""Records indexed by what the lookup rules require equal, so a lookup reads its key's few.

:func:`tunecache.rules.best` compares a key with every candidate it is given; a snapshot holds up
to 50,000, and scanning them all cost each new key 0.16 s. Every rule (``exact``, ``same_arch``,
``bucket``) requires the same kernel, source hash, backend, dtype and device arch, so records are
grouped by those (:func:`group_of`); within a group, a candidate must have the wanted problem
(``exact``, ``same_arch``) or its bucket (``bucket``), so each group is indexed by problem and, per
bucket policy asked with, by bucket. The index only narrows: :func:`~tunecache.rules.best` still
decides among the candidates it keeps, in their order, so an answer is the one a full scan gives.

A group may be filled on first use (``load``): a snapshot's records are validated only when a
lookup first reads their group (:func:`tunecache.snapshot.load_snapshot_index`).

Example:
    >>> from tunecache import key_for
    >>> wanted = key_for("matmul", "tvm", {"M": 64, "N": 64, "K": 64}, "float32").to_json()
    >>> RecordIndex([(wanted, "its winner")]).best(wanted, "strict")
    ('its winner', 'exact')
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from tunecache.policies import BucketPolicy, VersionPolicy, bucket_policy
from tunecache.rules import Rule, best

T = TypeVar("T")
GroupKey = tuple[Any, ...]
Entry = tuple[Mapping[str, Any], T]  # a tuned key as JSON, and its payload
GROUPED = ("kernel", "source_hash", "backend", "dtype")  # with the device's arch


def group_of(key: Mapping[str, Any]) -> GroupKey:
    """What every rule requires a candidate to share with the wanted key (compared with ``==``,
    as :func:`tunecache.rules.match` compares them)."""
    return (*(key[f] for f in GROUPED), key["device"]["arch"])


def loose(value: Any) -> Hashable:
    """A hashable stand-in for a JSON value, equal for any two values that
    :func:`tunecache.rules._same` finds the same (so an index by it never misses a candidate;
    it may hold one ``_same`` refuses, such as ``NaN``, which :func:`best` then refuses)."""
    if type(value) is dict:
        return ("dict", frozenset((k, loose(v)) for k, v in value.items()))
    if type(value) is list:
        return ("list", tuple(loose(v) for v in value))
    return (type(value), value)


class _Group(Generic[T]):
    """One group's entries in their order, by problem, and by bucket per bucket policy."""

    def __init__(self, entries: list[Entry[T]]) -> None:
        self.entries = entries
        self.by_problem = _positions(entries, lambda key: key["problem"])
        self.by_bucket: dict[BucketPolicy, dict[Hashable, list[int]] | None] = {}

    def candidates(self, wanted: Mapping[str, Any], buckets: BucketPolicy) -> list[Entry[T]]:
        """The entries that may match ``wanted`` by some rule, in their order."""
        near = self.by_problem
        found = set() if near is None else set(near.get(_loose_or_none(wanted["problem"]), ()))
        if buckets.dims:
            if buckets not in self.by_bucket:  # a race computes it twice, harmlessly
                self.by_bucket[buckets] = _positions(
                    self.entries, lambda key: buckets.bucket(key["problem"])
                )
            mates = self.by_bucket[buckets]
            if mates is None or near is None:
                return self.entries
            found.update(mates.get(_loose_or_none(buckets.bucket(wanted["problem"])), ()))
        elif near is None:
            return self.entries
        return [self.entries[i] for i in sorted(found)]


def _loose_or_none(value: Any) -> Hashable:
    try:
        held = loose(value)
        hash(held)
    except TypeError:
        return None
    return held


def _positions(
    entries: list[Entry[T]], of: Callable[[Mapping[str, Any]], Any]
) -> dict[Hashable, list[int]] | None:
    """The entries' positions by ``loose(of(key))``; ``None`` (scan them all) should a key hold
    something not hashable (never, for keys as JSON)."""
    index: dict[Hashable, list[int]] = {}
    try:
        for i, (key, _) in enumerate(entries):
            index.setdefault(loose(of(key)), []).append(i)
    except TypeError:
        return None
    return index


class RecordIndex(Generic[T]):
    """Candidates for the lookup rules, grouped so a lookup reads only its group.

    Args:
        entries: tuned keys as JSON with their payloads, in the order :func:`best` breaks ties by.
        load: fills a group not in ``entries`` on its first lookup (``None``: it is empty); its
            entries must be all of that group's, in their order.
    """

    def __init__(
        self,
        entries: Iterable[Entry[T]] = (),
        load: Callable[[GroupKey], list[Entry[T]]] | None = None,
    ) -> None:
        grouped: dict[GroupKey, list[Entry[T]]] = {}
        for key, payload in entries:
            grouped.setdefault(group_of(key), []).append((key, payload))
        self._groups: dict[GroupKey, _Group[T]] = {g: _Group(e) for g, e in grouped.items()}
        self._load = load
        self._lock = threading.Lock()

    def renew_after_fork(self) -> None:
        """In a forked child: a lock of its own (a parent thread loading a group held it)."""
        self._lock = threading.Lock()

    def group(self, key: GroupKey) -> _Group[T] | None:
        """The group of ``key``, filled on first use where the index loads groups."""
        held = self._groups.get(key)
        if held is not None or self._load is None:
            return held
        with self._lock:  # one load of each group: its warnings once
            if key not in self._groups:
                self._groups[key] = _Group(self._load(key))
            return self._groups[key]

    def best(
        self, wanted: Mapping[str, Any], policy: VersionPolicy, buckets: BucketPolicy | None = None
    ) -> tuple[T, Rule] | None:
        """What :func:`tunecache.rules.best` answers given every entry, read from ``wanted``'s
        group only."""
        try:
            key = group_of(wanted)
            hash(key)
        except TypeError:  # an unhashable field: no entry has one
            return None
        group = self.group(key)
        if group is None or not group.entries:
            return None
        if buckets is None:
            buckets = bucket_policy(wanted["kernel"])
        return best(wanted, group.candidates(wanted, buckets), policy, buckets)
