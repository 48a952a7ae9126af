"""Records: upload a tuning result, look a key up, list and read records."""

from __future__ import annotations

from functools import partial
from typing import Annotated

import anyio.from_thread
from fastapi import APIRouter, HTTPException, Query, Request, Response, status

from cache_server import jobs, queries, quota
from cache_server.api.auth import READ, WriteAccess
from cache_server.api.body import JsonRoute
from cache_server.api.deps import IdPath, SessionDep, SettingsDep
from cache_server.api.problems import UNPROCESSABLE
from cache_server.api.shedding import MOVE
from cache_server.db import again_after_a_conflict
from cache_server.lookup import find_winner
from cache_server.metrics import MetricsDep
from cache_server.trust import SERVED_STATUSES, winner_table
from tunecache.schemas import (
    INT64_MAX,
    Backend,
    LookupRequest,
    LookupResponse,
    Name,
    RecordCreate,
    RecordList,
    RecordPublic,
    RecordStatus,
    UploadResult,
)

router = APIRouter(route_class=JsonRoute, prefix="/v1", tags=["records"])


@router.post(
    "/records",
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {"model": UploadResult,
              "description": "this token sent this very record before: nothing is stored, the "
              "answer is where that record stands now"},
        403: {"description": "the token's quota of stored bytes has no room for it"},
        409: {"description": "a new key's record in a shape bucket at the server's limit"},
    },
)  # fmt: skip
def upload_record(
    record: RecordCreate,
    session: SessionDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    token: WriteAccess,
    response: Response,
) -> UploadResult:
    """Stores a tuning result with all its trials, as this token's upload.

    Its config must pass its backend's closed schema (a 422 names the field). The key's winner
    becomes this record only if it passed validation and is strictly faster than the current
    winner; the answer says which record is the winner now. A record is ``pending`` until a
    verifier re-checks it (``verified`` at once from a trusted token). The same record sent
    again by the same token (its answer lost, say) is stored once: a 200 says where it stands.
    A non-admin token is charged the record's bytes against the server's quota; past it, a 403
    names the quota and nothing is stored.
    """
    key_hash = record.key.digest()
    room = quota.room(session, token, settings.token_bytes)
    add = partial(queries.add_record, session, key_hash=key_hash, record=record,
                  uploader=token, bucket_limit=settings.bucket_winners, room=room)  # fmt: skip
    added = again_after_a_conflict(session, add)
    if added.winner == added.record_id and added.status in SERVED_STATUSES[settings.policy]:
        jobs.answered(session, key_hash=key_hash, record_id=added.record_id)  # its miss is answered
    quota.charge(session, token, added.stored_bytes, quota=settings.token_bytes)  # the last lock
    if added.again:
        response.status_code = status.HTTP_200_OK
    else:
        metrics.count_upload(validated=record.validation.passed,
                             is_winner=added.winner == added.record_id)  # fmt: skip
    return UploadResult(
        record_id=added.record_id,
        key_hash=key_hash,
        winner_record_id=added.winner,
        is_winner=added.winner == added.record_id,
        status=added.status,  # type: ignore[arg-type]
        policy=settings.policy,
    )


@router.post(
    "/lookup",
    dependencies=[READ],
    response_model=LookupResponse,
    responses={404: {"description": "no validated record for this key"}},
)
def lookup(
    request: LookupRequest, session: SessionDep, settings: SettingsDep, metrics: MetricsDep,
    asked: Request,
) -> Response:  # fmt: skip
    """The best validated winner that may serve this key (404 on a miss).

    Rules, in order: the exact key; the same problem on another device of the same arch; the
    nearest shape in the key's bucket (``bucket``: the dimensions the caller's kernel rounds to a
    power of two; absent, the server's own registration of it). ``policy`` decides which
    environment versions may serve; the server's serving policy which records may (never a
    disputed or rejected one).
    """
    found = find_winner(session, key=request.key, policy=request.policy,
                        serving=settings.policy, bucket=request.bucket,
                        ranking=partial(_rank_aside, asked, settings.retry_after))  # fmt: skip
    session.commit()  # ends the reads on this thread: the dependency has nothing left to end
    if found is None:
        metrics.count_lookup(rule=None)
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"no validated record may serve key {request.key.digest()} "
            f"under the {request.policy} version policy",
        )
    record, rule = found
    metrics.count_lookup(rule=rule)
    answer = LookupResponse(record=record, match=rule, policy=request.policy)
    # The record was validated as it was read; returning the model would validate it once more
    # (FastAPI checks a returned model against response_model), on the hottest path there is.
    return Response(answer.model_dump_json(by_alias=True), media_type="application/json")


def _rank_aside(asked: Request, retry_after: int, size: int) -> None:
    """Moves this lookup, about to rank ``size`` winners, to the ranking lane of the load
    shedding (from this worker thread, on the event loop).

    Raises:
        HTTPException: 503, when that lane has no slot for it.
    """
    move = asked.scope.get("state", {}).get(MOVE)
    if move is None:  # no load shedding in front of the app
        return
    busy = anyio.from_thread.run(move)
    if busy is not None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                            f"the server is busy ({busy}); retry in {retry_after} s",
                            headers={"Retry-After": str(retry_after)})  # fmt: skip


@router.get("/records", dependencies=[READ])
def list_records(
    session: SessionDep,
    settings: SettingsDep,
    kernel: Annotated[Name | None, Query()] = None,
    backend: Backend | None = None,
    dtype: Annotated[Name | None, Query()] = None,
    device_arch: Annotated[Name | None, Query()] = None,
    key_hash: Annotated[str | None, Query(pattern=r"^[0-9a-f]{64}$")] = None,
    validated: bool | None = None,
    record_status: Annotated[RecordStatus | None, Query(alias="status")] = None,
    winners_only: bool = False,
    limit: Annotated[int, Query(ge=1)] = 100,
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
) -> RecordList:
    """Records matching every given filter, newest first; trials and every check of a validation
    but its worst are left out (``GET /v1/records/{id}`` has them).

    An answer holds at most the server's ``answer_bytes`` of records (8 MiB by default): fewer
    than ``limit`` records then, however many ``count`` says match. Page on with ``offset`` plus
    the number of items received.

    ``kernel``, ``dtype`` and ``device_arch`` are names, as in a key: one with a character no
    name has (a NUL, which PostgreSQL's text cannot hold) is a 422 naming the parameter.
    """
    if limit > settings.list_limit:
        raise HTTPException(
            UNPROCESSABLE,
            f"limit {limit} is over the server's maximum of {settings.list_limit}",
        )
    filters = queries.RecordFilters(
        kernel=kernel,
        backend=backend,
        dtype=dtype,
        device_arch=device_arch,
        key_hash=key_hash,
        validated=validated,
        status=record_status,
    )
    items, total = queries.list_records(
        session,
        filters=filters,
        winners_only=winners_only,
        limit=limit,
        offset=offset,
        table=winner_table(settings.policy),
        budget=settings.answer_bytes,
    )
    return RecordList(items=items, count=total)


@router.get(
    "/records/{record_id}",
    dependencies=[READ],
    responses={404: {"description": "no such record"}},
)
def get_record(record_id: IdPath, session: SessionDep, settings: SettingsDep) -> RecordPublic:
    """One record with every trial of its search (``is_winner``: under the server's policy)."""
    record = queries.get_record(session, record_id=record_id, table=winner_table(settings.policy))
    if record is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no record {record_id}")
    return record
