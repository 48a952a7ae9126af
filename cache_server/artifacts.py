"""Artifact queries: the atomic upsert and the paged reads. They never commit.

Each uploader keeps its own copy of an item (``token_id``: an item's digest names its namespace,
partition, key, item *and* token), so no token's upload overwrites another's: a teammate's honest
item stays stored beside another token's made-up score, and comes back into service when that
token is revoked. The upsert is one statement per item, ``INSERT … ON CONFLICT (digest) DO
UPDATE … WHERE`` the new value may replace the token's stored one: when that one has no score or
the new score is lower (an unscored item replaces only an unscored one). Concurrent writers of
one item leave the best-scored value whatever order they commit in.

A read serves each item once, from the best of its copies whose token is live (not revoked): a
trusted token's before an untrusted one's, then the lowest score (unscored last), then the first
stored. Artifacts have no verifier: under the ``verified`` serving policy only trusted tokens'
copies are read back. Whatever is read back passes its namespace's closed schema again (a row
written before the schema, or behind the API, is never served).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Text, and_, cast, or_, select
from sqlalchemy.orm import Session, aliased

from cache_server.budget import stored_size, within
from cache_server.db import upsert_insert
from cache_server.models import ArtifactRow, TokenRow, utcnow
from cache_server.quota import artifact_bytes, charge, room
from tunecache.artifacts import ArtifactIn, ArtifactPublic
from tunecache.canonical import digest
from tunecache.configcheck import artifact_problem

logger = logging.getLogger(__name__)


def item_digest(item: ArtifactIn) -> str:
    """The name every copy of an item shares: SHA-256 of its namespace, partition, key and item
    (a copy stored without a token has it as its :func:`artifact_digest` too)."""
    return digest([item.namespace, item.partition, item.key, item.item])


def artifact_digest(item: ArtifactIn, token_id: int | None) -> str:
    """The one unique name of a token's copy of an item: SHA-256 of its namespace, partition,
    key, item and the token's id (without a token, as stored before copies were per token)."""
    if token_id is None:
        return item_digest(item)
    return digest([item.namespace, item.partition, item.key, item.item, token_id])


def put_artifacts(
    session: Session, *, items: Sequence[ArtifactIn], uploader: TokenRow | None = None,
    quota: int | None = None,
) -> int:  # fmt: skip
    """Upserts ``items`` as ``uploader``'s copies; returns how many were written (new or
    replaced: the others' stored copy of this uploader scored better, or held this very value
    unscored). The uploader is charged what those written store
    (:func:`cache_server.quota.artifact_bytes`) against ``quota`` (``None``: not charged).

    The rows are written in the order of their digests (two batches that share items, sent in
    opposite orders, each held a row the other waited for: PostgreSQL ends one of them).

    Raises:
        QuotaFull: the items written would take ``uploader`` past ``quota`` (none is stored;
            the writes stop at the first item past its room, read as they start).
    """
    stored = written = 0
    left = room(session, uploader, quota)
    trusted = uploader is not None and uploader.trusted
    name, token_id = (None, None) if uploader is None else (uploader.name, uploader.id)
    for row_digest, item in sorted(((artifact_digest(i, token_id), i) for i in items),
                                   key=lambda pair: pair[0]):  # fmt: skip
        now = utcnow()
        stmt = upsert_insert(session, ArtifactRow).values(
            digest=row_digest, item_digest=item_digest(item),
            namespace=item.namespace, partition=item.partition, key=item.key, item=item.item,
            value=item.value, score=item.score, updated_at=now, uploaded_by=name,
            token_id=token_id, trusted=trusted,
        )  # fmt: skip
        stmt = stmt.on_conflict_do_update(
            index_elements=[ArtifactRow.digest],
            set_={
                "value": stmt.excluded.value,
                "score": stmt.excluded.score,
                "updated_at": now,
                "uploaded_by": stmt.excluded.uploaded_by,
            },
            # NULL > x is not true: an unscored item never replaces a scored one; an unscored
            # copy is rewritten only with another value (the same one, sent again, was charged
            # again each time: a tune sends its workload's every run).
            where=or_(
                and_(
                    ArtifactRow.score.is_(None),
                    or_(
                        stmt.excluded.score.is_not(None),
                        cast(ArtifactRow.value, Text) != cast(stmt.excluded.value, Text),
                    ),
                ),
                ArtifactRow.score > stmt.excluded.score,
            ),
        )
        # RETURNING gives a row exactly when the item was written (rowcount is -1 on psycopg).
        if session.execute(stmt.returning(ArtifactRow.id)).first() is not None:
            stored += 1
            written += artifact_bytes(item, name)
            if left is not None:  # past the room, the rest is not written
                left.ensure(written, f"these {len(items)} items ({stored} of them alone)")
    if quota is not None:  # the last lock this transaction takes (cache_server.quota)
        charge(session, uploader, written, quota=quota, what=f"these {stored} items")
    return stored


def list_artifacts(
    session: Session,
    *,
    namespace: str,
    partition: str,
    key: str | None,
    after: int | None,
    limit: int,
    trusted_only: bool = False,
    budget: int,
) -> tuple[list[ArtifactPublic], int | None]:
    """Items of one partition (and key), best score first within a key, else by id (only trusted
    tokens' with ``trusted_only``), and the ``after`` of the next page (``None``: no more).

    Each item is served once, from its best live copy (:func:`_served`). Without ``key`` the
    order is by id, and ``after`` pages through it. The leading items whose values fit in
    ``budget`` bytes together are read (:mod:`cache_server.budget`: a key's best, a partition's
    page with a next one), and an item its namespace's closed schema refuses is left out
    (logged): a page may hold fewer than ``limit``.
    """
    stmt = select(ArtifactRow.id).where(
        _served(namespace, partition, key, trusted_only=trusted_only)
    )
    keys: list[tuple[Any, bool]] = [(ArtifactRow.id, False)]
    if key is not None:
        keys = [(ArtifactRow.score.is_(None), False), (ArtifactRow.score, False), keys[0]]
    if after is not None:
        stmt = stmt.where(ArtifactRow.id > after)
    page = within(stmt, keys, ArtifactRow, stored_size(ArtifactRow.value), budget, limit=limit)
    rows = session.execute(
        select(ArtifactRow, page.c.paged).join(page, page.c.id == ArtifactRow.id)
        .order_by(*(k for k, _ in keys))
    ).all()  # fmt: skip
    kept = []
    for row, _ in rows:
        if (why := artifact_problem(row.namespace, row.value)) is not None:
            logger.warning("not serving artifact %d (%s): %s", row.id, row.namespace, why)
            continue
        kept.append(_public(row))
    more = bool(rows) and (len(rows) < rows[0][1] or rows[0][1] == limit)
    return kept, rows[-1][0].id if key is None and more else None


def _served(namespace: str, partition: str, key: str | None, *, trusted_only: bool) -> Any:
    """Which copies are served (a condition on :class:`ArtifactRow`): of each item of the
    partition (and key), the best copy whose token is live, a trusted token's first, then the
    lowest score (unscored last), then the first stored; a copy stored without a token counts
    as live.

    Asked of each row a page reads, as a subquery of that row's item by the item's digest alone
    (the one index that names it), not ranked over the whole partition (which doubled the time
    to read 20,000 items whole), nor by the item's namespace, partition, key and name: without
    statistics for a freshly filled table, PostgreSQL's planner then scanned the partition for
    each row (an anti-join, 19 s for a first page; a subquery by partition's index, 7 s).
    """
    other = aliased(ArtifactRow)
    best = (
        select(other.id)
        .where(other.item_digest == ArtifactRow.item_digest, _live(other),
               *([other.trusted.is_(True)] if trusted_only else []))
        .order_by(other.trusted.desc(), other.score.is_(None), other.score, other.id)
        .limit(1).correlate(ArtifactRow).scalar_subquery()
    )  # fmt: skip
    served = [ArtifactRow.namespace == namespace, ArtifactRow.partition == partition,
              ArtifactRow.id == best]  # fmt: skip
    if key is not None:
        served.append(ArtifactRow.key == key)
    if trusted_only:
        served.append(ArtifactRow.trusted.is_(True))
    return and_(*served)


def _live(copy: Any) -> Any:
    """Whether ``copy``'s token is not revoked (a copy without a token is live)."""
    revoked = select(TokenRow.id).where(TokenRow.id == copy.token_id,
                                        TokenRow.revoked_at.is_not(None))  # fmt: skip
    return ~revoked.exists()


def _public(row: ArtifactRow) -> ArtifactPublic:
    return ArtifactPublic.model_construct(
        **{name: getattr(row, name) for name in ArtifactPublic.model_fields}
    )
