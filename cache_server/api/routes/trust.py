"""Trust: consumers dispute a served record; verifiers claim records to re-check and store what
they found (:mod:`cache_server.trust`)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response, status

from cache_server import jobs, queries, trust
from cache_server.api.auth import IdentifiedAccess, VerifyAccess
from cache_server.api.body import JsonRoute
from cache_server.api.deps import IdPath, SessionDep, SettingsDep
from cache_server.ratelimit import too_many
from tunecache.jobs import LeaseRelease, LeaseRequest
from tunecache.schemas import STORED, RecordPublic
from tunecache.tokens import name_text
from tunecache.verification import (
    OWN_AWAITING_HEADER,
    DisputeCreate,
    DisputeResult,
    VerificationCreate,
    VerifyClaimRequest,
    VerifyTask,
)

router = APIRouter(route_class=JsonRoute, prefix="/v1", tags=["trust"])
NOT_LEASED: dict[int | str, dict[str, str]] = {
    409: {"description": "the record is not leased to this worker (or was decided)"}
}


def _record(session: SessionDep, record_id: int) -> RecordPublic:
    found = queries.get_record(session, record_id=record_id, with_trials=False)
    assert found is not None
    return found


@router.post(
    "/records/{record_id}/disputes",
    responses={
        404: {"description": "no such record"},
        409: {"description": "the record does not serve this problem (nor its shape bucket)"},
        429: {"description": "too many disputes from this token"},
    },
)
def dispute_record(
    record_id: IdPath,
    dispute: DisputeCreate,
    session: SessionDep,
    settings: SettingsDep,
    token: IdentifiedAccess,
    http: Request,
) -> DisputeResult:
    """Reports that the record's config failed a consumer's check where it was used.

    Needs a token (of any scope), even where reads are open: a dispute stops the record being
    served under every policy until a verifier re-verifies it. One open dispute per token and
    record counts; a token may send ``disputes_per_minute`` a minute to a server process. A
    dispute that leaves its key served by none opens again the jobs its key's records answered
    (:func:`cache_server.jobs.reopen`, as a rejection does): a write token completed a miss
    with its own upload, then disputed it, and every later miss of the key found its job done
    (a daemon's re-tune leaves the disputed config out)."""
    if wait := http.app.state.dispute_limiter.wait(f"token:{token.id}"):
        raise too_many(f"more than {settings.disputes_per_minute} disputes a minute", wait)
    try:
        row = trust.add_dispute(session, record_id=record_id, reporter=token.name,
                                dispute=dispute)  # fmt: skip
    except trust.OutsideBucket as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no record {record_id}")
    if row.status == "disputed" and not trust.served(session, row.key_hash, settings.policy):
        why = f"record {row.id} was disputed by {name_text(token.name)}: its key is served by none"
        jobs.reopen(session, key_hash=row.key_hash, error=why)
    return DisputeResult(record_id=row.id, status=row.status, disputes=row.disputes)  # type: ignore[arg-type]


@router.post(
    "/verifications/claim",
    responses={
        204: {
            "description": "nothing to verify for this arch and these backends; "
            f"``{OWN_AWAITING_HEADER}``: how many await another verify "
            "token, this token's own uploads"
        }
    },
)
def claim_verification(
    request: VerifyClaimRequest, session: SessionDep, response: Response, token: VerifyAccess
) -> VerifyTask | None:
    """Leases the next pending or disputed record of the verifier's arch and backends (disputed
    ones first), with the problems it was disputed at, to this worker under this token (only
    they may settle it); 204 when there is none."""
    row = trust.claim(session, worker=request.worker, token_id=token.id,
                      device_arch=request.device_arch, backends=request.backends,
                      lease_seconds=request.lease_seconds)  # fmt: skip
    if row is None:
        response.status_code = status.HTTP_204_NO_CONTENT
        own = trust.own_awaiting(session, token_id=token.id, device_arch=request.device_arch,
                                 backends=request.backends)  # fmt: skip
        if own:
            response.headers[OWN_AWAITING_HEADER] = str(own)
        return None
    assert row.verify_expires_at is not None
    # As stored: a problem stored before its text was checked stays readable (a 500 otherwise,
    # on every claim of the record, which disputed ones lead).
    return VerifyTask.model_validate(
        {"record": _record(session, row.id),
         "disputed_problems": trust.disputed_problems(session, record_id=row.id),
         "lease_expires_at": row.verify_expires_at},
        context=STORED,
    )  # fmt: skip


@router.post(
    "/records/{record_id}/verification",
    responses=NOT_LEASED,
)
def verify_record(
    record_id: IdPath,
    result: VerificationCreate,
    session: SessionDep,
    settings: SettingsDep,
    token: VerifyAccess,
) -> RecordPublic:
    """Stores a verifier's finding on a record it leased: ``passed`` makes it ``verified`` (its
    time from now on is the verifier's, and the uploader's is flagged when it was more than 20 %
    faster), ``failed`` makes it ``rejected``, ``unverifiable`` gives it back to the queue. A
    rejected record that leaves its key served by none opens again the jobs its key's records
    answered (:func:`cache_server.jobs.reopen`)."""
    row = trust.finish(session, record_id=record_id, worker=result.worker, token_id=token.id,
                       verifier=token.name, result=result)  # fmt: skip
    if row is None:
        raise _not_leased(record_id, result.worker)
    if row.status == "rejected" and not trust.served(session, row.key_hash, settings.policy):
        why = f"record {row.id} was rejected by verifier {token.name!r}: its key is served by none"
        jobs.reopen(session, key_hash=row.key_hash, error=why)
    return _record(session, row.id)


@router.post("/records/{record_id}/verification/release", responses=NOT_LEASED)
def release_verification(
    record_id: IdPath, request: LeaseRelease, session: SessionDep, token: VerifyAccess
) -> RecordPublic:
    """Gives back a record this worker leased under this token, unchecked (the verifier
    stopped): claimable at once, the attempt refunded."""
    given = trust.release_verifications(session, token_id=token.id, record_id=record_id,
                                        worker=request.worker)  # fmt: skip
    return _leased(session, record_id, request.worker, given > 0)


@router.post("/records/{record_id}/verification/heartbeat", responses=NOT_LEASED)
def renew_verification(
    record_id: IdPath, request: LeaseRequest, session: SessionDep, token: VerifyAccess
) -> RecordPublic:
    """Renews the lease this worker holds on a record under this token, while it checks it."""
    renewed = trust.renew_verification(session, record_id=record_id, worker=request.worker,
                                       token_id=token.id,
                                       lease_seconds=request.lease_seconds)  # fmt: skip
    return _leased(session, record_id, request.worker, renewed)


def _leased(session: SessionDep, record_id: int, worker: str, held: bool) -> RecordPublic:
    """The record, as now, where ``worker`` held its lease under the token; else 409."""
    if not held:
        raise _not_leased(record_id, worker)
    return _record(session, record_id)


def _not_leased(record_id: int, worker: str) -> HTTPException:
    return HTTPException(
        status.HTTP_409_CONFLICT,
        f"record {record_id} is not leased to worker {worker!r} under this token for verification",
    )
