"""A snapshot file as a :class:`~tunecache.record_index.RecordIndex`, each record validated on
the first lookup of its group.

Validating all 50,000 records a snapshot may hold took most of a first lookup's 10–20 s, and a
process looks up a few kernels. The file is read and checked whole, as
:func:`~tunecache.snapshot.load_snapshot` does (its bounds, its format, its filters, the
record count), then each record's group (kernel, source hash, backend, dtype, arch: what every
lookup rule requires equal) is read from its JSON, and the records of a group are validated,
exactly as :func:`~tunecache.snapshot.load_snapshot` validates them, when a lookup first reads
it: a record that does not validate is left out with one warning, as there.

Whatever this cannot settle from a record's JSON is validated at once: a record whose group
fields are not plain names, or fall outside the filters (a valid one refuses the whole file, as
:func:`~tunecache.snapshot.load_snapshot` refuses it). A file that states provenance, or is not
a snapshot's shape at all, is loaded by :func:`~tunecache.snapshot.load_snapshot` itself, so
every refusal is its refusal, word for word.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tunecache.errors import validation_problems
from tunecache.jsonsafe import parse_json
from tunecache.record_index import GROUPED, Entry, GroupKey, RecordIndex, group_of
from tunecache.schemas import RecordCreate
from tunecache.snapshot import (
    MAX_SNAPSHOT_RECORDS,
    SnapshotFilters,
    SnapshotPublic,
    index_snapshot,
    read_snapshot_bytes,
    validated_snapshot,
    winners,
)
from tunecache.strict import SERVED

logger = logging.getLogger(__name__)

# Field values that validation keeps as they are (a name's pattern admits them; nothing to
# escape): a record's JSON so written is grouped by them before it is validated.
_PLAIN = re.compile(r"[A-Za-z0-9_.:+-]+")
_PLAIN_LINE = re.compile(r"[A-Za-z0-9_.:+()/-]+(?: [A-Za-z0-9_.:+()/-]+)*")

Pending = list[tuple[int, Any]]  # (position in the file, a record's JSON or a validated record)


def load_snapshot_index(path: Path) -> RecordIndex[RecordCreate]:
    """The winners of the snapshot file at ``path`` (:func:`~tunecache.snapshot.index_snapshot`)
    for the lookup rules, each record validated before a lookup first reads it.

    Raises:
        InvalidInput: as :func:`~tunecache.snapshot.load_snapshot` does, for the same files.
    """
    text = read_snapshot_bytes(path)
    pending = _pending(path, text)
    if pending is None:
        return eager_index(validated_snapshot(path, text))
    del text

    def load(group: GroupKey) -> list[Entry[RecordCreate]]:
        # Taken out of ``pending`` once loaded, not before: a child forked while a parent
        # thread loads the group loads it again from what is still there.
        loaded = _load(path, pending.get(group, []))
        pending.pop(group, None)
        return loaded

    return RecordIndex(load=load)


def eager_index(snapshot: SnapshotPublic) -> RecordIndex[RecordCreate]:
    """The winners of a snapshot validated whole, for the lookup rules."""
    return RecordIndex(_entry(r) for r in index_snapshot(snapshot).values())


def key_json(record: RecordCreate) -> dict[str, Any]:
    """A record's key as :func:`tunecache.rules.best` compares it."""
    return record.key.model_dump(mode="json", by_alias=True)


def _entry(record: RecordCreate) -> Entry[RecordCreate]:
    return key_json(record), record


def _pending(path: Path, text: bytes) -> dict[GroupKey, Pending] | None:
    """The file's records by group, those settled now validated; ``None``: load it whole (not
    a snapshot's shape, provenance stated, or a valid record outside the filters)."""
    try:
        document = parse_json(text)
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get("provenance") is not None:
        return None
    records = document.get("records")
    if not isinstance(records, list) or len(records) > MAX_SNAPSHOT_RECORDS:
        return None
    try:  # the whole file's checks but the records': format, filters, no other field
        filters = SnapshotPublic.model_validate({**document, "records": []},
                                                context=SERVED).filters  # fmt: skip
    except ValidationError:
        return None
    pending: dict[GroupKey, Pending] = {}
    strays: Pending = []
    for i, record in enumerate(records):
        group = _plain_group(record, filters)
        if group is None:
            strays.append((i, record))
        else:
            pending.setdefault(group, []).append((i, record))
    settled, left_out = _validate(strays)
    if any(filters.mismatch(record.key) is not None for _, record in settled):
        return None  # refused whole, by load_snapshot's own words
    for i, record in settled:
        held = pending.setdefault(group_of(key_json(record)), [])
        held.append((i, record))
        held.sort(key=lambda item: item[0])
    _warn(path, left_out)
    return pending


def _plain_group(record: Any, filters: SnapshotFilters) -> GroupKey | None:
    """The group of a record's JSON where validation keeps its fields as they are and they are
    the filters'; else ``None`` (validated now)."""
    key = record.get("key") if type(record) is dict else None
    device = key.get("device") if type(key) is dict else None
    if type(device) is not dict:
        return None
    assert isinstance(key, Mapping)
    group = (*(key.get(f) for f in GROUPED), device.get("arch"))
    if not all(type(v) is str and _PLAIN.fullmatch(v) for v in group):
        return None
    kernel, _, backend, _, arch = group
    name = device.get("name")
    if arch != filters.device_arch or filters.kernel not in (None, kernel) or \
            filters.backend not in (None, backend):  # fmt: skip
        return None
    if filters.device_name is not None and not (
        name == filters.device_name and type(name) is str and _PLAIN_LINE.fullmatch(name)
    ):
        return None
    return group


def _validate(records: Pending) -> tuple[list[tuple[int, RecordCreate]], list[str]]:
    """Each record validated as :func:`~tunecache.snapshot.load_snapshot` validates one, and why
    each other one is left out."""
    kept: list[tuple[int, RecordCreate]] = []
    left_out = []
    for i, record in records:
        if isinstance(record, RecordCreate):
            kept.append((i, record))
            continue
        try:
            kept.append((i, RecordCreate.model_validate(record, context=SERVED)))
        except ValidationError as exc:
            left_out.append(f"records[{i}]: {validation_problems(exc, 1)}")
    return kept, left_out


def _load(path: Path, records: Pending) -> list[Entry[RecordCreate]]:
    """One group's winners, its records validated now."""
    kept, left_out = _validate(records)
    _warn(path, left_out)
    return [_entry(r) for r in winners(record for _, record in kept).values()]


def _warn(path: Path, left_out: list[str]) -> None:
    if left_out:
        logger.warning("%s: %d record(s) of the snapshot left out: %s", path, len(left_out),
                       "; ".join(left_out[:3]))  # fmt: skip
