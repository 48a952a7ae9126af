"""Artifact queries: the atomic upsert and the paged reads. They never commit.

The upsert is one statement per item, ``INSERT … ON CONFLICT (digest) DO UPDATE … WHERE`` the new
item may replace the stored one: a trusted token's always replaces an untrusted one's, an
untrusted one's never replaces a trusted one's, and otherwise when the stored one has no score or
the new score is lower (an unscored item replaces only an unscored one). Concurrent writers of one
item leave the best-scored value whatever order they commit in.

Artifacts have no verifier: under the ``verified`` serving policy only trusted tokens' items are
read back. Whatever is read back passes its namespace's closed schema again (a row written before
the schema, or behind the API, is never served).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from cache_server.budget import stored_size, within
from cache_server.db import upsert_insert
from cache_server.models import ArtifactRow, TokenRow, utcnow
from tunecache.artifacts import ArtifactIn, ArtifactPublic
from tunecache.canonical import digest
from tunecache.configcheck import artifact_problem

logger = logging.getLogger(__name__)


def artifact_digest(item: ArtifactIn) -> str:
    """The one unique name of an item: SHA-256 of its namespace, partition, key and item."""
    return digest([item.namespace, item.partition, item.key, item.item])


def put_artifacts(
    session: Session, *, items: Sequence[ArtifactIn], uploader: TokenRow | None = None
) -> int:
    """Upserts ``items`` as ``uploader``'s; returns how many were written (new or replaced)."""
    stored = 0
    trusted = uploader is not None and uploader.trusted
    name = None if uploader is None else uploader.name
    for item in items:
        now = utcnow()
        stmt = upsert_insert(session, ArtifactRow).values(
            digest=artifact_digest(item), namespace=item.namespace, partition=item.partition,
            key=item.key, item=item.item, value=item.value, score=item.score, updated_at=now,
            uploaded_by=name, trusted=trusted,
        )  # fmt: skip
        stmt = stmt.on_conflict_do_update(
            index_elements=[ArtifactRow.digest],
            set_={
                "value": stmt.excluded.value,
                "score": stmt.excluded.score,
                "updated_at": now,
                "uploaded_by": stmt.excluded.uploaded_by,
                "trusted": stmt.excluded.trusted,
            },
            where=or_(
                and_(stmt.excluded.trusted.is_(True), ArtifactRow.trusted.is_(False)),
                and_(
                    ArtifactRow.trusted == stmt.excluded.trusted,
                    # NULL > x is not true: an unscored item never replaces a scored one.
                    or_(ArtifactRow.score.is_(None), ArtifactRow.score > stmt.excluded.score),
                ),
            ),
        )
        # RETURNING gives a row exactly when the item was written (rowcount is -1 on psycopg).
        stored += session.execute(stmt.returning(ArtifactRow.id)).first() is not None
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

    Without ``key`` the order is by id, and ``after`` pages through it. The leading items whose
    values fit in ``budget`` bytes together are read (:mod:`cache_server.budget`: a key's best, a
    partition's page with a next one), and an item its namespace's closed schema refuses is left
    out (logged): a page may hold fewer than ``limit``.
    """
    stmt = select(ArtifactRow.id).where(
        ArtifactRow.namespace == namespace, ArtifactRow.partition == partition
    )
    if trusted_only:
        stmt = stmt.where(ArtifactRow.trusted.is_(True))
    keys: list[tuple[Any, bool]] = [(ArtifactRow.id, False)]
    if key is not None:
        stmt = stmt.where(ArtifactRow.key == key)
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


def _public(row: ArtifactRow) -> ArtifactPublic:
    return ArtifactPublic.model_construct(
        **{name: getattr(row, name) for name in ArtifactPublic.model_fields}
    )
