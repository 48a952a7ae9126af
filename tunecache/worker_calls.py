"""The API calls of tuning workers and verifiers: the job queue and record verification.

A part of :class:`tunecache.client.Client` (which it is mixed into): each call goes through the
client's ``_call`` (one deadline per call; a :class:`~tunecache.errors.ServerError` on failure).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from tunecache.answers import RECORD_CONTAINERS, SMALL_ANSWER_CONTAINERS, job_page
from tunecache.errors import ServerError
from tunecache.http import answer_limit, parse
from tunecache.jobs import ClaimRequest, JobCreate, JobEnqueued, JobList, JobPublic
from tunecache.key import Key
from tunecache.schemas import MAX_TRIALS_BYTES, KeyModel, RecordPublic
from tunecache.strict import printable_text
from tunecache.verification import (
    OWN_AWAITING_HEADER,
    VerificationCreate,
    VerifyClaimRequest,
    VerifyTask,
)

M = TypeVar("M", bound=BaseModel)
# Bytes a verification task's answer may read: a record (its trials at most MAX_TRIALS_BYTES) and
# the problems it was disputed at (64 are kept). 128 MiB of problems held a verifier at 5.4 GB.
TASK_ANSWER_BYTES = 2 * MAX_TRIALS_BYTES
logger = logging.getLogger(__name__)


class WorkerCalls:
    """Job-queue and verification calls (mixed into :class:`tunecache.client.Client`)."""

    def _call(
        self, method: str, path: str, timeout: float | None = None, *, read: bool = False,
        small: bool = False, **kwargs: Any,
    ) -> httpx.Response:  # fmt: skip
        raise NotImplementedError  # the client's

    # -- verifiers (a token with the verify scope) ------------------------------------------
    def claim_verification(
        self, worker: str, *, device_arch: str, backends: Sequence[str],
        lease_seconds: float = 600.0,
    ) -> VerifyTask | None:  # fmt: skip
        """Leases the next record this verifier can re-check (``None``: nothing to do)."""
        body = VerifyClaimRequest(worker=worker, device_arch=device_arch,
                                  backends=list(backends),  # type: ignore[arg-type]
                                  lease_seconds=lease_seconds).model_dump(mode="json")  # fmt: skip
        with answer_limit(TASK_ANSWER_BYTES):
            response = self._call("POST", "/v1/verifications/claim", json=body)
        if response.status_code == 204:
            self._say_own_awaiting(response, device_arch)
            return None
        return parse(VerifyTask, response, "/v1/verifications/claim",  # a record, and problems
                     max_containers=RECORD_CONTAINERS)  # fmt: skip

    def _say_own_awaiting(self, response: httpx.Response, device_arch: str) -> None:
        """Warns when the server says records await another verify token, this token's own
        uploads (one verify token held by a tuning daemon and its verifier left the daemon's
        uploads unverified for good, without a word): once per count, however often a claim
        polls. A count that is not a small decimal number (a hostile server's) is ignored."""
        said = response.headers.get(OWN_AWAITING_HEADER, "")
        count = int(said) if said.isascii() and said.isdecimal() and len(said) <= 9 else 0
        if count and count != getattr(self, "_own_awaiting_said", None):
            logger.warning(
                "%d record%s of %s await another verifier: they are this token's own uploads, "
                "and a verify token is never handed its own records to check; give the tuning "
                "daemon a write token of its own (tunecache token create --scope write)",
                count, "" if count == 1 else "s", device_arch,
            )  # fmt: skip
        self._own_awaiting_said = count

    def heartbeat_verification(self, record_id: int, worker: str, *,
                               lease_seconds: float = 600.0) -> RecordPublic:  # fmt: skip
        """Extends the lease of a record this verifier is checking."""
        path = f"/v1/records/{record_id}/verification/heartbeat"
        body = {"worker": worker, "lease_seconds": lease_seconds}
        return parse(RecordPublic, self._call("POST", path, json=body), path,
                     max_containers=RECORD_CONTAINERS)  # fmt: skip

    def release_verification(self, record_id: int, worker: str, *,
                             timeout: float | None = None) -> RecordPublic:  # fmt: skip
        """Gives back a record this verifier leased, unchecked (it stops): claimable again at
        once, the attempt refunded."""
        path = f"/v1/records/{record_id}/verification/release"
        response = self._call("POST", path, timeout, json={"worker": worker})
        return parse(RecordPublic, response, path, max_containers=RECORD_CONTAINERS)

    def submit_verification(self, record_id: int, result: VerificationCreate) -> RecordPublic:
        """Stores a verifier's finding on a record it holds the lease of; the record as now."""
        path = f"/v1/records/{record_id}/verification"
        body = result.model_dump(mode="json", by_alias=True)
        response = self._call("POST", path, json=body)
        return parse(RecordPublic, response, path, max_containers=RECORD_CONTAINERS)

    # -- the job queue (tuning workers) -------------------------------------------------------
    def create_job(
        self,
        key: Key,
        *,
        priority: int = 0,
        max_attempts: int = 3,
        strategy: str | None = None,
        trials: int | None = None,
    ) -> JobEnqueued:
        """Queues a tuning job for ``key`` (one per key: an existing one is answered), tuned with
        ``strategy`` and ``trials`` (unset: the worker's own)."""
        body = JobCreate(key=KeyModel.from_key(key), priority=priority, max_attempts=max_attempts,
                         strategy=strategy, trials=trials)  # fmt: skip
        json = body.model_dump(mode="json", by_alias=True)
        return self._job("POST", "/v1/jobs", JobEnqueued, json=json)

    def get_job(self, job_id: int) -> JobPublic:
        """The job ``job_id`` as the server holds it now."""
        return self._job("GET", f"/v1/jobs/{job_id}", JobPublic)

    def cancel_job(self, job_id: int) -> JobPublic:
        """Cancels an open job this token queued (an admin token: any): it ends ``failed``,
        "cancelled by" this token; a worker running it loses its lease. Asking for its key
        again queues it again."""
        return self._job("POST", f"/v1/jobs/{job_id}/cancel", JobPublic)

    def claim_job(
        self,
        worker: str,
        *,
        lease_seconds: float = 300.0,
        device_arch: str | None = None,
        backends: Sequence[str] | None = None,
        kernel_packages: Sequence[str] | None = None,
        key_hashes: Sequence[str] | None = None,
        sources: Sequence[tuple[str, str, str]] | None = None,
    ) -> JobPublic | None:
        """Leases the most urgent job this worker can run (``None``: nothing to do): of
        ``device_arch``, one of ``backends``, a built-in kernel or one of ``kernel_packages``',
        for one of ``key_hashes``, and of no other version of a kernel than ``sources`` lists
        (``(kernel, backend, source_hash)``) (each unset: any).

        Raises:
            ServerError: as every call; and a server too old to limit a claim to ``key_hashes``
                (it would hand out any job).
        """
        listed = {"backends": backends, "kernel_packages": kernel_packages,
                  "key_hashes": key_hashes}  # fmt: skip
        wanted: dict[str, Any] = {
            "worker": worker, "lease_seconds": lease_seconds, "device_arch": device_arch,
            **{k: None if v is None else list(v) for k, v in listed.items()},
        }  # fmt: skip
        if sources is not None:
            wanted["sources"] = [dict(zip(("kernel", "backend", "source_hash"), s, strict=True))
                                 for s in sources]  # fmt: skip
        body = ClaimRequest.model_validate(wanted).model_dump(mode="json", exclude_none=True)
        while True:
            for field in getattr(self, "_unfiltered_claims", ()):
                body.pop(field, None)
            try:
                response = self._call("POST", "/v1/jobs/claim", small=True, json=body)
                break
            except ServerError as exc:
                if exc.status_code == 422 and "key_hashes" in str(exc):
                    raise ServerError(f"the server cannot limit a claim to given keys (older "
                                      f"than this client; upgrade it): no job claimed ({exc})",
                                      status_code=422) from None  # fmt: skip
                self._older_server(exc, body)
        if response.status_code == 204:
            return None
        return parse(JobPublic, response, "/v1/jobs/claim", max_containers=SMALL_ANSWER_CONTAINERS)

    def _older_server(self, exc: ServerError, body: dict[str, Any]) -> None:
        """Leaves out of this client's claims the filter a server older than it refused (422
        naming it), said once: it hands out jobs of any kernel package (the worker refuses a
        kernel it may not import, failing that job) or version (the worker fails a job of
        another) — upgrade it.

        Raises:
            ServerError: ``exc``, naming no such filter the claim carries.
        """
        filters = {"kernel_packages": "kernel package", "sources": "kernel version"}
        refused = [f for f in filters if f in body and f in str(exc)]
        if exc.status_code != 422 or not refused:
            raise exc
        logger.warning("the server cannot filter claims by %s: %s", filters[refused[0]], exc)
        self._unfiltered_claims = (*getattr(self, "_unfiltered_claims", ()), refused[0])

    def heartbeat_job(self, job_id: int, worker: str, *, lease_seconds: float = 300.0) -> JobPublic:
        """Extends the lease of a job this worker holds."""
        body = {"worker": worker, "lease_seconds": lease_seconds}
        return self._job("POST", f"/v1/jobs/{job_id}/heartbeat", JobPublic, json=body)

    def release_job(self, job_id: int, worker: str, *, timeout: float | None = None) -> JobPublic:
        """Gives back a job this worker holds, its attempt unfinished (the worker stops): queued
        again, claimable at once, the attempt refunded."""
        body = {"worker": worker}
        path = f"/v1/jobs/{job_id}/release"
        return self._job("POST", path, JobPublic, json=body, timeout=timeout)

    def complete_job(self, job_id: int, worker: str, record_id: int) -> JobPublic:
        body = {"worker": worker, "record_id": record_id}
        return self._job("POST", f"/v1/jobs/{job_id}/complete", JobPublic, json=body)

    def fail_job(self, job_id: int, worker: str, error: str) -> JobPublic:
        """Gives a job back as failed (retried until its attempts run out), saying why."""
        body = {"worker": worker, "error": printable_text(error, 4096)}
        return self._job("POST", f"/v1/jobs/{job_id}/fail", JobPublic, json=body)

    def list_jobs(self, **filters: Any) -> JobList:
        """A page of jobs (``limit``: at most so many, ``offset``, ``state``)."""
        params = {k: v for k, v in filters.items() if v is not None}
        bound = job_page(params.get("limit"))  # at most ``limit`` jobs
        return self._job("GET", "/v1/jobs", JobList, bound, small=False, params=params)

    def _job(self, method: str, path: str, model: type[M],
             max_containers: int = SMALL_ANSWER_CONTAINERS, *, small: bool = True,
             **kwargs: Any) -> M:  # fmt: skip
        """One job call's answer as ``model``, of at most ``max_containers`` arrays and objects
        (default: one job's, with room to spare), and ``small`` (one job, not a page of them)."""
        response = self._call(method, path, small=small, **kwargs)
        return parse(model, response, path, max_containers=max_containers)
