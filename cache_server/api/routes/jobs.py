"""The tuning-job queue: create (deduplicated by key), claim with a lease, heartbeat, give back,
finish."""

from __future__ import annotations

import functools
import ipaddress
from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, Response, status

from cache_server import job_counts, job_pages, jobs, quota, twins
from cache_server.api.auth import READ, ReadAccess, WriteAccess
from cache_server.api.body import JsonRoute
from cache_server.api.deps import IdPath, SessionDep, SettingsDep
from cache_server.api.problems import UNPROCESSABLE
from cache_server.metrics import MetricsDep
from cache_server.models import JobRow, TokenRow, utcnow
from cache_server.ratelimit import too_many
from cache_server.settings import ServerSettings
from tunecache.errors import InvalidInput
from tunecache.jobs import (
    MAX_JOB_PAGE,
    MAX_LISTED_KEYS,
    MISS_SOURCE,
    OPEN_STATES,
    ClaimRequest,
    JobCreate,
    JobDone,
    JobEnqueued,
    JobList,
    JobPublic,
    JobResult,
    JobState,
    KeyHash,
    LeaseRelease,
    LeaseRequest,
    cancelled,
)
from tunecache.kernels import KERNEL_REF, builtin_problem, registered
from tunecache.key_model import KeyModel
from tunecache.schemas import INT64_MAX, STORED, LookupRequest
from tunecache.served import UNSERVED_STATUSES
from tunecache.tokens import grants

router = APIRouter(route_class=JsonRoute, prefix="/v1", tags=["jobs"])
LEASE_LOST: dict[int | str, dict[str, str]] = {409: {"description": "lease lost"}}
MISS_PRIORITY = -10  # misses seen in production queue behind explicit pre-tuning

# The strategies a daemon tunes with, by backend (what ``tuner.tune.strategy_problem`` takes:
# ``tuner.search.STRATEGIES`` where the backend has a space to search, and its own search). The
# server never imports the tuner (the layers); tests/test_job_checks.py holds the two alike.
SEARCHES = frozenset({"bayes", "exhaustive", "local", "optuna", "portfolio", "random"})
JOB_STRATEGIES: dict[str, frozenset[str]] = {
    "triton": SEARCHES,
    "tvm": SEARCHES | {"meta_schedule"},
    "inductor": frozenset({"inductor_max_autotune"}),
}


def unrunnable(key: KeyModel, strategy: str | None = None) -> str | None:
    """Why no daemon can run a job for ``key`` with ``strategy``, the field named first, or
    ``None``. Only what the server knows: a built-in kernel's backends and dtypes (a user's
    kernel's are known only where it is imported, a ``package.module:Class``), and each
    backend's strategies. A bare name is a built-in's or no kernel at all: a daemon imports
    none by a bare name (``nosuchkernel`` was queued, claimed and failed on every attempt)."""
    spec = registered(key.kernel) if ":" not in key.kernel else None
    if spec is None and not KERNEL_REF.fullmatch(key.kernel):
        return f"key.kernel: {key.kernel!r} is no built-in kernel and no 'package.module:Class'"
    if spec is not None:
        try:
            spec.check_dtype(key.dtype, key.backend)
        except InvalidInput as exc:
            return f"{'key.dtype' if key.backend in spec.backends else 'key.backend'}: {exc}"
    known = JOB_STRATEGIES.get(key.backend, frozenset())
    if strategy is not None and strategy not in known:
        return (f"strategy: {strategy!r} is not a strategy of {key.backend}; known: "
                f"{', '.join(sorted(known))}")  # fmt: skip
    return None


def public(job: JobRow) -> JobPublic:
    return JobPublic.model_validate(job, from_attributes=True, context=STORED)


def _held(job: JobRow | None, job_id: int, session: SessionDep) -> JobPublic:
    """``job`` as answered, or where the worker no longer holds it, the 409 saying why (a
    cancelled job's worker is told so: not a lease lost to another)."""
    if job is None:
        why = "is not running under a lease of this worker and this token"
        now = session.get(JobRow, job_id, populate_existing=True)  # not a copy read before
        if now is not None and cancelled(now):
            why = f"was {now.error}: it is not to be run"
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} {why}")
    return public(job)


def _holder(token: TokenRow) -> int | None:
    """The token a lease must have been claimed with; ``None`` for an admin's, which may end any
    lease (a job a lost worker holds)."""
    return None if grants(token.scope, "admin") else token.id  # type: ignore[arg-type]


@router.post(
    "/jobs",
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {"model": JobEnqueued, "description": "the key's job, already queued"},
        429: {"description": "this token's open jobs are at the server's cap"},
    },
)
def create_job(
    request: JobCreate,
    session: SessionDep,
    settings: SettingsDep,
    token: WriteAccess,
    response: Response,
) -> JobEnqueued:
    """Queues a tuning job for a key; an existing job for the key is returned instead (200), a
    failed (or cancelled) one queued again first, this token's from then on: with this request's
    attempts, priority and budget if this token queued it (or is an admin's), else with its own
    within this token's bounds.

    A non-admin token's job gets at most the server's ``job_priority_max`` priority and
    ``job_attempts_max`` attempts (more is lowered to them: the answer's job shows what it
    got), and the token may have at most ``jobs_open_per_token`` open (queued or running) jobs:
    past it, a request that would open one more is refused (429). A job no daemon could run (a
    built-in kernel's backend or dtype it lacks, a strategy unknown on the key's backend) is
    refused (422, naming the field)."""
    if (why := unrunnable(request.key, request.strategy)) is not None:
        raise HTTPException(UNPROCESSABLE, why)
    key_hash = request.key.digest()
    who = f"token:{token.id}"
    admin = _holder(token) is None  # an admin token: not bounded
    priority, max_attempts = request.priority, request.max_attempts
    if not admin:
        priority = min(priority, settings.job_priority_max)
        max_attempts = min(max_attempts, settings.job_attempts_max)
        existing = jobs.find(session, key_hash=key_hash)
        if existing is None or existing.state == "failed":  # this request opens a job
            _check_open_jobs(session, settings, token)
    jobs.requeue_failed(session, key_hash=key_hash, max_attempts=max_attempts, priority=priority,
                        strategy=request.strategy, trials=request.trials,
                        requester=who,
                        caps=None if admin else (settings.job_priority_max,
                                                 settings.job_attempts_max))  # fmt: skip
    job, created = jobs.enqueue(
        session,
        request.key.to_key(),
        priority=priority,
        max_attempts=max_attempts,
        source=request.source,
        strategy=request.strategy,
        trials=request.trials,
        requested_by=who,
    )
    if created:  # the last lock (cache_server.quota)
        quota.charge(session, token, quota.job_bytes(job.key, (who,)),
                     quota=settings.token_bytes, what="this job")  # fmt: skip
    else:
        response.status_code = status.HTTP_200_OK
    return JobEnqueued(job=public(job), created=created)


def _check_open_jobs(session: SessionDep, settings: ServerSettings, token: TokenRow) -> None:
    """A 429 when ``token`` has ``jobs_open_per_token`` open jobs (queued or running, from
    ``POST /v1/jobs`` or its misses). Counted behind the token's lock, held until the insert
    commits: concurrent requests, in any server process, never both fit under the cap."""
    job_counts.lock_open_jobs(session, token_id=token.id)
    cap = settings.jobs_open_per_token
    if job_counts.count_open(session, requested_by=f"token:{token.id}") >= cap:
        raise too_many(
            f"this token has {cap} open (queued or running) jobs, the server's cap per token "
            "(TUNECACHE_SERVER_JOBS_OPEN_PER_TOKEN): wait for some to finish",
            60.0,
        )


@router.post(
    "/misses",
    status_code=status.HTTP_202_ACCEPTED,
    responses={429: {"description": "too many reports from this caller, or new jobs from misses"}},
)
def report_miss(
    request: LookupRequest,
    session: SessionDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    caller: ReadAccess,
    http: Request,
) -> JobEnqueued:
    """A client could not serve this key: queue it (deduplicated) behind pre-tuning jobs.

    Rate-limited: each caller (its token, else its address) may report
    ``miss_reports_per_minute`` a minute to a server process; misses may create at most
    ``miss_jobs_per_minute`` new jobs a minute in all, and one caller's at most its share of
    those (``miss_jobs_per_caller``), both counted in the database; a token's misses count
    among its open jobs (``jobs_open_per_token``, 429 past it, as ``POST /v1/jobs``). A key
    already queued is answered as is.
    """
    who = f"token:{caller.id}" if caller is not None else f"addr:{_network(http)}"
    who = who[:64]  # the column's width; an address is at most 45 characters
    if wait := http.app.state.miss_limiter.wait(who):
        raise too_many(
            f"more than {settings.miss_reports_per_minute} miss reports a minute from this caller",
            wait,
        )
    if (why := builtin_problem(request.key.kernel, request.key.problem)) is not None:
        raise HTTPException(UNPROCESSABLE, f"key: {why}")  # no job
    if (why := unrunnable(request.key)) is not None:
        raise HTTPException(UNPROCESSABLE, why)  # no job either
    key_hash = request.key.digest()
    if (existing := jobs.find(session, key_hash=key_hash)) is not None:
        metrics.count_miss_report()
        return JobEnqueued(job=public(existing), created=False)
    if caller is not None and _holder(caller) is not None:  # a token's, bounded as its jobs are
        _check_open_jobs(session, settings, caller)
    _check_new_job_budget(session, settings, who)
    job, created = jobs.enqueue(
        session,
        request.key.to_key(),
        priority=MISS_PRIORITY,
        source=MISS_SOURCE,
        requested_by=who,
    )
    if created:  # a token's (the last lock); misses without a token are bounded a minute
        quota.charge(session, caller, quota.job_bytes(job.key, (who,)),
                     quota=settings.token_bytes, what="this miss's job")  # fmt: skip
    metrics.count_miss_report()
    return JobEnqueued(job=public(job), created=created)


ANONYMOUS = "addr:"  # what the names of the callers without a token start with


def _network(http: Request) -> str:
    """A caller without a token: its IPv4 address, or its IPv6 address's /64 (one host holds a
    whole /64: counted by address, each of its requests could come as a new caller)."""
    host = http.client.host if http.client else "unknown"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:  # a dual-stack socket's IPv4 caller
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def _check_new_job_budget(session: SessionDep, settings: ServerSettings, who: str) -> None:
    """A 429 when misses created the server's new jobs of the last minute, ``who``'s share of
    them, or (``who`` without a token) half of them from callers without a token: one caller
    cannot spend everyone's budget, nor four addresses the budget of the callers with a token
    (60 junk jobs from 127.0.0.2-5 in a minute and a consumer's miss was refused). Counted
    behind the budget's lock, held until the insert commits: concurrent misses, in any server
    process, never both fit under a limit that has room for one."""
    job_counts.lock_miss_budget(session)
    since = utcnow() - timedelta(minutes=1)
    share = settings.miss_jobs_per_caller
    misses = functools.partial(job_counts.count_created, session, source=MISS_SOURCE, since=since)
    if misses(requested_by=who) >= share:
        raise too_many(
            f"this caller's misses created {share} new jobs in the last minute, its share of "
            f"the server's {settings.miss_jobs_per_minute}",
            30.0,
        )
    anonymous = max(1, settings.miss_jobs_per_minute // 2)
    if who.startswith(ANONYMOUS) and misses(callers=ANONYMOUS) >= anonymous:
        raise too_many(
            f"misses of callers without a token created {anonymous} new jobs in the last "
            f"minute, their share of the server's {settings.miss_jobs_per_minute}: send a token",
            30.0,
        )
    if misses() >= settings.miss_jobs_per_minute:
        raise too_many(
            f"misses created {settings.miss_jobs_per_minute} new jobs in the last minute, "
            "the server's limit",
            30.0,
        )


@router.post(
    "/jobs/claim",
    response_model=JobPublic,
    responses={204: {"description": "no job to claim"}},
)
def claim_job(
    request: ClaimRequest, session: SessionDep, token: WriteAccess, settings: SettingsDep
) -> JobPublic | Response:
    """Leases the most urgent queued (or lease-expired) job the worker can run to it, under this
    token: only this worker with this token (or an admin token) may renew, complete or fail it.
    A worker works one job at a time: one holding a live lease under this token is handed that
    job again (a claim asked again after its answer was lost), spending no attempt. That does
    not renew the lease (a heartbeat does): a worker claiming in a loop gets its job back only
    until the lease runs out. A worker that names the versions (source hashes) of kernels it
    runs is not handed a job of another version of one of them, until the job has waited
    ``version_wait_seconds`` for a worker of its version."""
    job = jobs.claim(session, worker=request.worker, token_id=token.id, token_name=token.name,
                     lease_seconds=request.lease_seconds,
                     device_arch=request.device_arch, backends=request.backends,
                     kernel_packages=request.kernel_packages,
                     key_hashes=request.key_hashes,
                     sources=[(s.kernel, s.backend, s.source_hash)
                              for s in request.sources or ()],
                     version_wait=settings.version_wait_seconds)  # fmt: skip
    return Response(status_code=status.HTTP_204_NO_CONTENT) if job is None else public(job)


@router.post("/jobs/{job_id}/heartbeat", responses=LEASE_LOST)
def heartbeat(
    job_id: IdPath, request: LeaseRequest, session: SessionDep, token: WriteAccess
) -> JobPublic:
    """Renews the lease this worker holds under this token."""
    job = jobs.heartbeat(session, job_id=job_id, worker=request.worker, holder=_holder(token),
                         lease_seconds=request.lease_seconds)  # fmt: skip
    return _held(job, job_id, session)


@router.post("/jobs/{job_id}/release", responses=LEASE_LOST)
def release(
    job_id: IdPath, request: LeaseRelease, session: SessionDep, token: WriteAccess
) -> JobPublic:
    """Gives back the lease this worker holds under this token (an admin's token: any worker's
    lease, a job a lost machine holds), its attempt unfinished: the job is queued again,
    claimable at once, the attempt refunded."""
    job = jobs.release(session, job_id=job_id, worker=request.worker, holder=_holder(token))
    return _held(job, job_id, session)


@router.post(
    "/jobs/{job_id}/cancel",
    responses={
        403: {"description": "another caller queued the job: only it or an admin cancels it"},
        404: {"description": "no such job"},
        409: {"description": "the job is not open: done or failed already"},
    },
)
def cancel(job_id: IdPath, session: SessionDep, token: WriteAccess) -> JobPublic:
    """Cancels an open (queued or running) job: it ends ``failed``, "cancelled by" this token,
    and no worker claims it again; a worker running it loses its lease (its renewal and its
    completion are refused). A write token cancels the jobs it queued (``POST /v1/jobs``, its
    misses), an admin's any. Asking for the key again (``POST /v1/jobs``, ``tunecache
    pretune``) queues it again."""
    job = jobs.get_job(session, job_id=job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id}")
    mine = None if _holder(token) is None else f"token:{token.id}"
    if job.state in OPEN_STATES and mine is not None and job.requested_by != mine:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"job {job_id} was queued by another "
                            "caller: only it or an admin token may cancel it")  # fmt: skip
    cancelled = jobs.cancel(session, job_id=job_id, requester=mine, by=token.name)
    if cancelled is None:  # ended (before, or meanwhile), or another's since
        now = session.get(JobRow, job_id, populate_existing=True)
        state = now.state if now is not None else "gone"
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} is {state}: only a queued "
                            "or running job of this caller can be cancelled")  # fmt: skip
    quota.charge(session, token, quota.text_bytes(cancelled.error), quota=None)  # the last lock
    return public(cancelled)


@router.post(
    "/jobs/{job_id}/complete",
    responses={
        409: {"description": "lease lost, or no such record, or one out of service"},
        422: {"description": "the record was tuned for another kernel, problem, dtype or arch"},
    },
)
def complete(
    job_id: IdPath, request: JobDone, session: SessionDep, token: WriteAccess
) -> JobPublic:
    """Finishes a job this worker holds under this token (else 409, before any record is read)
    with the record it uploaded, which must exist and be in service (validated, neither
    rejected nor disputed: else 409, as a record rejected since opens the job again) and answer
    the job: its key's kernel, kernel source, backend, dtype, problem and device arch are the
    job's (422); its device and versions are the worker's own.

    The record is read behind its key's lock, as a verifier's finding is written: a rejection
    between the check and the completion left the job done with a record never served (the
    rejection reopened done jobs only, and this one was not done yet). A disputed one answered
    the job while served by none: a write token disputed its own upload and completed a miss
    with it, and every later miss of the key found its job done."""
    holder = _holder(token)
    job = jobs.held(session, job_id=job_id, worker=request.worker, holder=holder)
    if job is not None:
        _check_answer(session, job, request.record_id)
        job = jobs.complete(session, job_id=job_id, worker=request.worker, holder=holder,
                            record_id=request.record_id)  # fmt: skip
    return _held(job, job_id, session)


_WHY_UNSERVED = {  # of each of UNSERVED_STATUSES
    "rejected": "a verifier rejected it",
    "disputed": "it is disputed, out of service until a verifier re-checks it",
}


def _check_answer(session: SessionDep, job: JobRow, record_id: int) -> None:
    """409 when there is no record ``record_id`` or it is out of service, 422 when it does not
    answer ``job``."""
    record = twins.lock(session, record_id)
    if record is None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"no record {record_id}")
    if record.status in UNSERVED_STATUSES or not record.validated:
        unserved = _WHY_UNSERVED.get(record.status, "it failed validation")
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"record {record_id} answers no job: {unserved}")  # fmt: skip
    if (why := jobs.mismatch(job.key, record.key)) is not None:
        raise HTTPException(UNPROCESSABLE,
                            f"record {record_id} does not answer job {job.id}: {why}")  # fmt: skip


@router.post("/jobs/{job_id}/fail", responses=LEASE_LOST)
def fail(
    job_id: IdPath,
    request: JobResult,
    session: SessionDep,
    settings: SettingsDep,
    token: WriteAccess,
) -> JobPublic:
    """A failed attempt of the lease this worker holds under this token: the job is queued
    again (claimable after the server's retry delay, doubling with each attempt) until it runs
    out of attempts."""
    job = jobs.fail(session, job_id=job_id, worker=request.worker, holder=_holder(token),
                    error=request.error, reporter=token.name,
                    retry_seconds=settings.retry_seconds)  # fmt: skip
    if job is not None:  # its error, charged each time it is written (the last lock)
        quota.charge(session, token, quota.text_bytes(request.error, token.name), quota=None)
    return _held(job, job_id, session)


@router.get("/jobs", dependencies=[READ])
def list_jobs(
    session: SessionDep,
    settings: SettingsDep,
    state: JobState | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_JOB_PAGE)] = 100,
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    key_hash: Annotated[list[KeyHash] | None, Query(max_length=MAX_LISTED_KEYS)] = None,
) -> JobList:
    """Jobs of ``state`` (any, without), by id; with ``key_hash`` (repeated, up to 50), only
    those keys' jobs (a manifest's, without reading the whole queue). An answer holds at most
    the server's ``answer_bytes`` of jobs' keys and errors (8 MiB by default): fewer than
    ``limit`` jobs then, however many ``count`` says there are. Page on with ``offset`` plus
    the number of items received."""
    rows, total = job_pages.list_jobs(session, state=state, limit=limit, offset=offset,
                                      budget=settings.answer_bytes,
                                      key_hashes=key_hash)  # fmt: skip
    return JobList(items=[public(r) for r in rows], count=total)


# ``:digits``: a static path beside it (``/jobs/claim``) is never taken for a job id, so a wrong
# method there is a 405, not a 422 about the id.
@router.get(
    "/jobs/{job_id:digits}", dependencies=[READ], responses={404: {"description": "no such job"}}
)
def get_job(job_id: IdPath, session: SessionDep) -> JobPublic:
    job = jobs.get_job(session, job_id=job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id}")
    return public(job)
