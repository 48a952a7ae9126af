"""What one token may store: the bytes of the records, artifacts and jobs it has stored, counted
in the database (``token_usage``) against the server's ``token_bytes`` (an admin token's are
counted, never bounded).

Without it a write token could fill the server's disk: records that fail validation or do not
win are stored all the same (for analysis), and so are artifacts and failed jobs, and a
reviewer's client stored 27 uploads of 14.3 MiB in 15 s. Each write is charged what it stores,
as the database stores it (:func:`record_bytes`, :func:`artifact_bytes`, :func:`job_bytes`,
:func:`text_bytes`): every JSON column as SQLAlchemy writes it (``json.dumps``: a character past
ASCII is 6 or 12 bytes), every text column, and what a row costs beyond them (its other columns,
its index entries, the page it sits in: :data:`RECORD_ROW`, ...). An artifact written again is
charged again, never credited back (a credit read before a concurrent replacement could be given
twice, and usage would fall below what is stored); an unchanged one is not written. Nothing is
ever deleted, so a token's usage only grows; a write over the quota is refused whole (403,
nothing stored) and an upload waits in its client's outbox until an admin raises the quota, or it
is sent with another token.

Every write that charges takes this table's row last, once its records' key locks, its
artifacts' and its jobs' rows are held, and holds nothing more until it commits: a charge waits
for another of the same token's only until that commits, and never in a circle. The row has no
foreign key: a key's check would lock the token's row, which a revocation holds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cache_server.db import upsert_insert
from cache_server.models import RecordRow, TokenRow, TokenUsageRow
from tunecache.artifacts import ArtifactIn
from tunecache.schemas import Trial
from tunecache.tokens import byte_size

# What a row costs beyond its JSON and text columns: its other columns, its index entries
# (digests and names again) and its share of a page. Measured with rows as small as they come,
# filling a 4 MiB quota on SQLite (this 2-core AMD EPYC): the file grew 0.76 of what was charged
# for records (no trials or 3), 0.56 for artifacts (a 70-byte value), 0.52 for jobs; charged as
# the JSON alone, such rows grew it 2 to 7 times as much.
RECORD_ROW = 2048
TRIAL_ROW = 128
ARTIFACT_ROW = 768
JOB_ROW = 1024


class QuotaFull(Exception):
    """A write would take a token past the server's ``token_bytes`` (nothing is stored)."""


def charge(
    session: Session, token: TokenRow | None, size: int, *, quota: int | None,
    what: str = "this upload",
) -> None:  # fmt: skip
    """Adds ``size`` bytes to ``token``'s usage in this transaction; an admin token (or none:
    written behind the API) is not bounded by ``quota``, nor is any with ``quota`` ``None`` (a
    job's failure: its one error is stored in place of the last, each job's failures are
    bounded by its attempts and its jobs by their charges; a token at its quota must still
    give back the jobs it holds). ``what``: the bytes' name in a refusal.

    Raises:
        QuotaFull: ``token``'s usage with ``size`` would pass ``quota`` (nothing is added).
    """
    if token is None or size <= 0:
        return
    limit = None if token.scope == "admin" else quota
    if limit is not None and size > limit:
        raise QuotaFull(refusal(token, what, size, limit, used(session, token.id)))
    stmt = upsert_insert(session, TokenUsageRow).values(token_id=token.id, stored_bytes=size)
    grown = TokenUsageRow.stored_bytes + stmt.excluded.stored_bytes
    stmt = stmt.on_conflict_do_update(
        index_elements=[TokenUsageRow.token_id],
        set_={"stored_bytes": grown},
        where=None if limit is None else grown <= limit,
    )
    # RETURNING gives a row exactly when the usage grew (the WHERE held, or the row is new).
    if session.execute(stmt.returning(TokenUsageRow.token_id)).first() is None:
        assert limit is not None  # no WHERE: it grew
        raise QuotaFull(refusal(token, what, size, limit, used(session, token.id)))


@dataclass(frozen=True)
class Room:
    """What ``token`` may still store under its ``limit``, its usage (``held``) read without a
    lock before a write stores anything: a write that cannot fit is refused before its work (a
    token at its quota sending a 7.5 MB record in a loop left 486 MiB of dead rows on PostgreSQL
    in 90 s, each one stored and rolled back). :func:`charge` still decides: a concurrent
    write of the same token may take the room meanwhile."""

    token: TokenRow
    limit: int
    held: int
    what: str = "this upload"  # what a refusal names

    def ensure(self, size: int, what: str | None = None) -> None:
        """Raises :class:`QuotaFull` (a refusal naming ``what``, or the room's) if ``size``
        bytes do not fit."""
        if size > self.limit - self.held:
            raise QuotaFull(refusal(self.token, what or self.what, size, self.limit, self.held))


def room(session: Session, token: TokenRow | None, quota: int | None) -> Room | None:
    """``token``'s :class:`Room` under ``quota`` (``None``: not bounded: no token, an admin's,
    or no quota)."""
    if token is None or quota is None or token.scope == "admin":
        return None
    return Room(token, quota, used(session, token.id))


def used(session: Session, token_id: int) -> int:
    """The bytes token ``token_id`` has stored (since migration 0022: before, none counted)."""
    found = session.scalar(
        select(TokenUsageRow.stored_bytes).where(TokenUsageRow.token_id == token_id)
    )
    return int(found or 0)


def usage(session: Session, token_ids: list[int]) -> dict[int, int]:
    """Each of ``token_ids``' stored bytes (a token that stored nothing: absent)."""
    if not token_ids:
        return {}
    rows = session.execute(
        select(TokenUsageRow.token_id, TokenUsageRow.stored_bytes)
        .where(TokenUsageRow.token_id.in_(token_ids))
    ).all()  # fmt: skip
    return {token_id: int(stored) for token_id, stored in rows}


def refusal(token: TokenRow, what: str, size: int, quota: int, held: int) -> str:
    """Why ``what`` (``size`` bytes) is refused ``token``, which holds ``held`` of ``quota``."""
    return (
        f"token {token.name!r} has stored {byte_size(held)} of its quota of {byte_size(quota)} "
        f"(TUNECACHE_SERVER_TOKEN_BYTES): {what} would store {byte_size(size)} more, so none "
        "of it was stored; an admin may raise the quota"
    )


def json_size(value: Any) -> int:
    """The bytes of ``value`` in a JSON column: SQLAlchemy writes ``json.dumps(value)``."""
    return 0 if value is None else len(json.dumps(value))


def text_bytes(*texts: str | None) -> int:
    """The bytes of ``texts`` in text columns (UTF-8)."""
    return sum(len(t.encode()) for t in texts if t)


def record_bytes(row: RecordRow, trials: Sequence[Trial]) -> int:
    """What storing ``row`` and its ``trials`` stores."""
    columns = (row.key, row.config, row.timing, row.baselines, row.validation, row.search,
               row.provenance, row.verification)  # fmt: skip
    texts = (row.kernel, row.backend, row.dtype, row.device_arch, row.device_name,
             row.config_summary, row.uploaded_by, row.imported_by, row.key_hash, row.bucket_hash,
             row.upload_digest, row.config_digest, row.status)  # fmt: skip
    stored = RECORD_ROW + sum(map(json_size, columns)) + text_bytes(*texts)
    return stored + sum(TRIAL_ROW + json_size(t.config) + text_bytes(t.error) for t in trials)


def artifact_bytes(item: ArtifactIn, uploader: str | None) -> int:
    """What storing ``item`` (its copy of ``uploader``, a token's name) stores: its names are
    in two indexes beside the row."""
    names = text_bytes(item.namespace, item.partition, item.key)
    return ARTIFACT_ROW + json_size(item.value) + 3 * names + text_bytes(item.item, uploader)


def job_bytes(key: Mapping[str, Any], texts: Iterable[str | None] = ()) -> int:
    """What storing a job of ``key`` stores, with its ``texts`` (names, an error)."""
    return JOB_ROW + json_size(key) + text_bytes(*texts)
