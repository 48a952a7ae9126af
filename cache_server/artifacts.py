"""Artifact queries: the atomic upsert and the paged reads. They never commit.

The upsert is one statement per item, ``INSERT … ON CONFLICT (digest) DO UPDATE … WHERE`` the new
item may replace the stored one: when either has no score, or the new score is lower. Concurrent
writers of one item leave the best-scored value whatever order they commit in.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from cache_server.db import upsert_insert
from cache_server.models import ArtifactRow, utcnow
from tunecache.artifacts import ArtifactIn, ArtifactPublic
from tunecache.canonical import digest


def artifact_digest(item: ArtifactIn) -> str:
    """The one unique name of an item: SHA-256 of its namespace, partition, key and item."""
    return digest([item.namespace, item.partition, item.key, item.item])


def put_artifacts(session: Session, *, items: Sequence[ArtifactIn]) -> int:
    """Upserts ``items``; returns how many were written (new or replaced)."""
    stored = 0
    for item in items:
        now = utcnow()
        stmt = upsert_insert(session, ArtifactRow).values(
            digest=artifact_digest(item), namespace=item.namespace, partition=item.partition,
            key=item.key, item=item.item, value=item.value, score=item.score, updated_at=now,
        )  # fmt: skip
        stmt = stmt.on_conflict_do_update(
            index_elements=[ArtifactRow.digest],
            set_={"value": stmt.excluded.value, "score": stmt.excluded.score, "updated_at": now},
            where=or_(
                ArtifactRow.score.is_(None),
                stmt.excluded.score.is_(None),
                ArtifactRow.score > stmt.excluded.score,
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
) -> list[ArtifactPublic]:
    """Items of one partition (and key), best score first within a key, else by id.

    Without ``key`` the order is by id, and ``after`` pages through it.
    """
    stmt = select(ArtifactRow).where(
        ArtifactRow.namespace == namespace, ArtifactRow.partition == partition
    )
    if key is not None:
        stmt = stmt.where(ArtifactRow.key == key).order_by(
            ArtifactRow.score.is_(None), ArtifactRow.score, ArtifactRow.id
        )
    else:
        stmt = stmt.order_by(ArtifactRow.id)
    if after is not None:
        stmt = stmt.where(ArtifactRow.id > after)
    rows = session.scalars(stmt.limit(limit)).all()
    return [_public(row) for row in rows]


def _public(row: ArtifactRow) -> ArtifactPublic:
    return ArtifactPublic.model_construct(
        **{name: getattr(row, name) for name in ArtifactPublic.model_fields}
    )
