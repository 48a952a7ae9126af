"""Artifacts: the integrations' own JSON (Inductor choices, MetaSchedule records), put and read."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from cache_server import artifacts
from cache_server.api.auth import READ, WriteAccess
from cache_server.api.body import JsonRoute
from cache_server.api.deps import SessionDep, SettingsDep
from cache_server.api.problems import UNPROCESSABLE
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

router = APIRouter(route_class=JsonRoute, prefix="/v1", tags=["artifacts"])


@router.post(
    "/artifacts",
    responses={403: {"description": "the token's quota of stored bytes has no room for them"}},
)
def put_artifacts(
    batch: ArtifactBatch, session: SessionDep, settings: SettingsDep, token: WriteAccess
) -> ArtifactPutResult:
    """Stores every item in one transaction, as this token's.

    Each value must pass its namespace's closed schema (a 422 names the item). Each token keeps
    its own copy of an item (namespace, partition, key and item name): an upload replaces this
    token's copy when that has no score and another value, or the new score is lower (an
    unscored item never replaces a scored one); otherwise the stored copy is kept (and counted
    as kept). Which copy
    a read serves is decided then: a trusted token's first, then the lowest score, of the tokens
    not revoked. A non-admin token is charged the bytes of the items written against the
    server's quota; past it, a 403 names the quota and none is stored. ``served`` is false
    where no read will serve them: the ``verified`` policy, a token not trusted.
    """
    stored = artifacts.put_artifacts(session, items=batch.items, uploader=token,
                                     quota=settings.token_bytes)  # fmt: skip
    served = settings.policy != "verified" or bool(token.trusted)
    return ArtifactPutResult(stored=stored, kept=len(batch.items) - stored, served=served)


@router.get("/artifacts", dependencies=[READ])
def list_artifacts(
    session: SessionDep,
    settings: SettingsDep,
    namespace: Namespace,
    partition: Annotated[Partition, Query()],
    key: Annotated[ArtifactKey | None, Query()] = None,
    after: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
) -> ArtifactList:
    """The items of one partition, or of one key in it (under the server's ``verified``
    policy, only those trusted tokens uploaded: artifacts have no verifier).

    With ``key``: its best-scored ``limit`` items (unscored last). Without: the partition's items
    by id; pass ``next_after`` back as ``after`` for the next page (a page may hold fewer items
    than ``limit`` and still have a next one: one answer holds at most the server's
    ``answer_bytes`` of values, 8 MiB by default).
    """
    if key is not None and after is not None:
        raise HTTPException(
            UNPROCESSABLE,
            "after pages through a whole partition; a key's items come best first in one page",
        )
    items, next_after = artifacts.list_artifacts(
        session, namespace=namespace, partition=partition, key=key, after=after, limit=limit,
        trusted_only=settings.policy == "verified", budget=settings.answer_bytes,
    )  # fmt: skip
    return ArtifactList(items=items, next_after=next_after)
