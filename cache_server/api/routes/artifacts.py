"""Artifacts: the integrations' own JSON (Inductor choices, MetaSchedule records), put and read."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status

from cache_server import artifacts
from cache_server.api.auth import READ, WRITE
from cache_server.api.deps import SessionDep
from tunecache.artifacts import (
    MAX_PAGE,
    ArtifactBatch,
    ArtifactKey,
    ArtifactList,
    ArtifactPutResult,
    Namespace,
    Partition,
)
from tunecache.schemas import MAX_ID

router = APIRouter(prefix="/v1", tags=["artifacts"])


@router.post("/artifacts", dependencies=[WRITE])
def put_artifacts(batch: ArtifactBatch, session: SessionDep) -> ArtifactPutResult:
    """Stores every item in one transaction.

    An item replaces the one of the same namespace, partition, key and item name when either has
    no score or the new score is lower; otherwise the stored one is kept (and counted as kept).
    """
    stored = artifacts.put_artifacts(session, items=batch.items)
    return ArtifactPutResult(stored=stored, kept=len(batch.items) - stored)


@router.get("/artifacts", dependencies=[READ])
def list_artifacts(
    session: SessionDep,
    namespace: Namespace,
    partition: Annotated[Partition, Query()],
    key: Annotated[ArtifactKey | None, Query()] = None,
    after: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
) -> ArtifactList:
    """The items of one partition, or of one key in it.

    With ``key``: its best-scored ``limit`` items (unscored last). Without: the partition's items
    by id; pass ``next_after`` back as ``after`` for the next page.
    """
    if key is not None and after is not None:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_ENTITY,
            "after pages through a whole partition; a key's items come best first in one page",
        )
    items = artifacts.list_artifacts(
        session, namespace=namespace, partition=partition, key=key, after=after, limit=limit
    )
    full_page = key is None and len(items) == limit
    return ArtifactList(items=items, next_after=items[-1].id if full_page else None)
