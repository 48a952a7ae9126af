"""Snapshots: export the winners of a device arch as one document with an ETag; import one."""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, Response, status

from cache_server import snapshots
from cache_server.api.auth import READ, WRITE, WriteAccess
from cache_server.api.body import JsonRoute
from cache_server.api.deps import SessionDep, SettingsDep
from cache_server.api.problems import UNPROCESSABLE
from cache_server.db import again_after_a_conflict
from cache_server.trust import winner_table
from tunecache.snapshot import (
    SnapshotFilters,
    SnapshotImportResult,
    SnapshotPublic,
    render_snapshot,
)

router = APIRouter(route_class=JsonRoute, prefix="/v1", tags=["snapshots"])


class ExportQuery(SnapshotFilters):
    """An export's query: the filters, and whether to state each record's provenance."""

    provenance: bool = False


def _matches(if_none_match: str, etag: str) -> bool:
    """RFC 9110 weak comparison of ``If-None-Match`` against our strong ETag."""
    tags = [tag.strip() for tag in if_none_match.split(",")]
    return "*" in tags or etag in (tag.removeprefix("W/") for tag in tags)


@router.get(
    "/snapshot",
    response_model=SnapshotPublic,
    dependencies=[READ],
    responses={
        304: {"description": "the snapshot still has the ETag in If-None-Match"},
        422: {"description": "more winners than a snapshot may hold: narrow it"},
    },
)
def export_snapshot(
    query: Annotated[ExportQuery, Query()],
    session: SessionDep,
    settings: SettingsDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """The winner of every key of ``device_arch`` (narrowed by the other filters) under the
    server's serving policy (``verified``: verified records only).

    With ``provenance=true`` (what ``tunecache snapshot export`` asks for), the snapshot states
    each record's status, uploader, date, verifier and the device it timed on, and which figures
    are the uploader's own: an import elsewhere keeps them and gains no trust. Without it, the
    document is as before provenance existed (what clients of before read; ``sync`` files).

    Only winners are exported, and without their trials, to keep snapshots small. The body is
    canonical JSON with records ordered by key hash and no timestamp, so its ``ETag`` (SHA-256 of
    the canonical records) changes exactly when the winners do; send it back in
    ``If-None-Match`` to get 304 with no body while they have not. One holds at most 50,000
    winners and the server's ``snapshot_bytes`` of them (128 MiB by default): a 422 says to
    narrow it by ``kernel``, ``backend`` or ``device_name``.
    """
    filters = SnapshotFilters.model_validate(query.model_dump(exclude={"provenance"}))
    table = winner_table(settings.policy)
    try:
        records, stated = snapshots.snapshot_winners(
            session,
            filters=filters,
            table=table,
            max_bytes=settings.snapshot_bytes,
            provenance=query.provenance,
        )
    except snapshots.SnapshotTooLarge as exc:
        raise HTTPException(UNPROCESSABLE, str(exc)) from None
    body, etag = render_snapshot(filters, records, stated)
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if if_none_match is not None and _matches(if_none_match, etag):
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


@router.post(
    "/snapshot",
    dependencies=[WRITE],
    responses={
        413: {"description": "the body is over the server's size limit"},
        403: {"description": "the token's quota of stored bytes has no room for its records"},
        409: {"description": "a new key's record in a shape bucket at the server's limit"},
        422: {"description": "malformed, over the record limit, or a record outside the filters"},
    },
)
def import_snapshot(
    snapshot: SnapshotPublic, session: SessionDep, settings: SettingsDep, token: WriteAccess
) -> SnapshotImportResult:
    """Merges a snapshot, committed in chunks of keys (an import never holds every other
    writer for its whole run: :func:`cache_server.snapshots.import_records`): each record is
    stored as imported by this token.

    A key's winner becomes an imported record only if it is validated and strictly faster;
    unvalidated records are stored but never served. A record this token had sent before (the
    same snapshot imported again) is not stored twice, and not counted as imported. What the
    snapshot's ``provenance`` states is kept, never raised: a pending record stays pending, a
    verified one is verified only when this token is trusted (else pending); the uploader shown
    is the one it names, "imported by" this token. A snapshot without provenance states nobody's
    word: pending, uploader unnamed.
    """
    add = partial(snapshots.import_records, session, records=snapshot.records, uploader=token,
                  bucket_limit=settings.bucket_winners,
                  provenance=snapshot.provenance, quota=settings.token_bytes)  # fmt: skip
    imported, changed = again_after_a_conflict(session, add)  # the same snapshot, meanwhile
    return SnapshotImportResult(imported=imported, winners_changed=changed)
