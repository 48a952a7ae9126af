"""The client of one tunecache server: a typed API client that raises, and a resolver that
never does.

The API calls (records, lookups, misses, snapshots, tokens, health) raise :class:`ServerError`.
:meth:`Client.lookup` goes through :attr:`Client.resolver` (:mod:`tunecache.resolver`): the
in-process memo, then a local snapshot file if one was given (see :mod:`tunecache.snapshot`), then
the server (bounded by a :class:`Timeout`), then the caller's default config. Network failures,
timeouts and bad answers are logged once and answered with the default; after a failure the
server is not asked again for ``retry_after`` seconds, so a dead server costs one timeout, not one
per call.

Example:
    >>> from tunecache import key_for
    >>> key = key_for("matmul", "tvm", {"M": 64, "N": 64, "K": 64}, "float32")
    >>> with Client("http://127.0.0.1:8765") as client:  # doctest: +SKIP
    ...     hit = client.lookup(key, default={"schedule": "default"})
    ...     hit.source, hit.config
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar, get_args

import httpx
from pydantic import BaseModel, ValidationError

from tunecache import answers, forksafe
from tunecache.admin_calls import AdminCalls
from tunecache.artifact_calls import ArtifactCalls
from tunecache.defaults import default_config
from tunecache.errors import InvalidInput, ServerError
from tunecache.http import (
    LOOKUP_ANSWER_BYTES,
    LOOKUP_ANSWER_CONTAINERS,
    MAX_ANSWER_BYTES,
    SMALL_ANSWER_BYTES,
    Timeout,
    answer_limit,
    deadline,
    first_error,
    foreign,
    is_tunecache,
    missing,
    parse,
    refuses_field,
    rejected,
    shed_wait,
    time_left,
    tls_hint,
)
from tunecache.jobs import JobEnqueued
from tunecache.key import Key
from tunecache.lookup import LookupResult
from tunecache.measured import without_late_defaults
from tunecache.outbox import Later, stored_unserved
from tunecache.policies import VersionPolicy, caller_bucket
from tunecache.resolver import (
    Fits,
    Resolver,
    SnapshotSource,
    Source,
    Verify,
)
from tunecache.schemas import (
    KeyModel,
    LookupRequest,
    LookupResponse,
    RecordCreate,
    RecordList,
    RecordPublic,
    UploadResult,
)
from tunecache.server_source import ServerSource
from tunecache.settings import (
    checked_token,
    checked_url,
    env_timeout,
    env_token,
    env_url,
    snapshot_file,
)
from tunecache.snapshot import SnapshotFilters, SnapshotImportResult, SnapshotPublic
from tunecache.strict import SERVED, shown
from tunecache.verification import DisputeCreate, DisputeResult
from tunecache.worker_calls import WorkerCalls

M = TypeVar("M", bound=BaseModel)
NOT_MODIFIED = 304  # the one 3xx that is an answer (a snapshot unchanged), not a redirect

logger = logging.getLogger(__name__)


def _redirect(status: int) -> bool:
    """Whether ``status`` sends the client elsewhere (every 3xx but :data:`NOT_MODIFIED`):
    never followed, never read as an answer."""
    return 300 <= status < 400 and status != NOT_MODIFIED


def _token_said(token: str | None, given: bool, url: str) -> str:
    """What a 401 adds: which token the server refused, and where (its answer names neither).
    The integrations pass ``TUNECACHE_TOKEN``'s value as ``token=``: named as the variable."""
    try:
        from_env = not given or (token or "") == (env_token() or "")
    except InvalidInput:  # a malformed variable: not the token given
        from_env = False
    where = "in $TUNECACHE_TOKEN" if from_env else "given as token="
    if token:
        return f"the token {where}, sent to {url}"
    if from_env:
        return f"no token sent: $TUNECACHE_TOKEN is unset, and {url} asks for one"
    return f"no token sent (token=''), and {url} asks for one"


class Client(WorkerCalls, AdminCalls, ArtifactCalls):
    """A client of one tunecache server.

    Args:
        url: the server, e.g. ``http://127.0.0.1:8765``; ``TUNECACHE_URL`` when omitted.
        timeout: a :class:`Timeout`, or seconds for lookups; ``TUNECACHE_TIMEOUT`` when omitted.
        transport: an ``httpx`` transport (tests pass an in-memory one).
        retry_after: seconds to skip the server after a failed lookup.
        miss_ttl: seconds a miss is remembered before the server is asked again.
        policy: which environment versions the server may serve: ``strict`` (the versions
            installed here), ``compatible`` (same major.minor) or ``any``.
        report_misses: on a server miss, ask the server to tune the key (``POST /v1/misses``,
            within the lookup timeout, at most once per key per ``miss_ttl``); refusals, such as
            the server's rate limit, are logged at debug level and otherwise ignored.
        token: the API token to send; ``TUNECACHE_TOKEN`` when omitted, none when ``""``.
        snapshot: a snapshot file (:func:`tunecache.snapshot.save_snapshot`) to answer lookups
            from before asking the server; ``TUNECACHE_SNAPSHOT`` when omitted, none when ``""``.
            Read once, on the first lookup; a missing or corrupt file is logged once and ignored.

    Only the variables of what was not given are read (a ``TUNECACHE_TIMEOUT`` set wrong never
    stops a client given ``timeout``). A process forked from this one gets connections and a
    background thread of its own (:mod:`tunecache.forksafe`).

    Raises:
        InvalidInput: an unknown ``policy`` (at once, not at the first lookup), or a variable
            read that is set wrong (naming it).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        timeout: Timeout | float | None = None,
        transport: httpx.BaseTransport | None = None,
        retry_after: float = 30.0,
        miss_ttl: float = 60.0,
        policy: VersionPolicy = "strict",
        report_misses: bool = False,
        token: str | None = None,
        snapshot: str | os.PathLike[str] | None = None,
    ) -> None:
        if policy not in get_args(VersionPolicy):
            known = ", ".join(get_args(VersionPolicy))
            raise InvalidInput(f"policy={policy!r}: expected one of {known}")
        self.url = checked_url(url, "url=") if url else env_url()
        timeout = env_timeout() if timeout is None else timeout
        self.timeout = timeout if isinstance(timeout, Timeout) else Timeout(lookup=timeout)
        self.retry_after = retry_after
        self.miss_ttl = miss_ttl
        self.policy: VersionPolicy = policy
        self.report_misses = report_misses
        self.sends_bucket = True  # a user's kernel's bucket, until a server refuses the field
        self.said_pending = False  # upload_later warned once that its uploads wait unserved
        given = token is not None
        token = env_token() if token is None else checked_token(token, "token=")
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._token_said = _token_said(token, given, self.url)
        self._transport = transport  # identity: as large on the wire as in memory
        self._headers = {"Accept-Encoding": "identity", **auth}
        self._http = forksafe.connect(self.url, transport, self._headers)
        sources: list[Source] = []
        snapshot = snapshot_file() if snapshot is None else snapshot
        if snapshot:
            sources.append(SnapshotSource(Path(snapshot), policy))
        self.server = self._server_source()
        sources.append(self.server)
        self.resolver = Resolver(sources)
        forksafe.track(self)  # a forked child gets connections of its own

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        forksafe.forget(self)
        self.resolver.close()  # sends the miss reports still queued
        self._http.close()

    def _server_source(self) -> ServerSource:
        return ServerSource(self, retry_after=self.retry_after, miss_ttl=self.miss_ttl,
                            report_misses=self.report_misses)  # fmt: skip

    def renew_after_fork(self) -> None:
        """In a forked child: connections and a server source of its own (:mod:`.forksafe`)."""
        self._http = forksafe.connect(self.url, self._transport, self._headers)
        old, self.server = self.server, self._server_source()
        self.server.inherit(old)
        self.resolver = forksafe.renewed(self.resolver, old, self.server)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- run-time lookups ------------------------------------------------------------------
    def lookup(
        self,
        key: Key,
        *,
        default: dict[str, Any] | None = None,
        fits: Fits | None = None,
        verify: Verify | None = None,
    ) -> LookupResult:
        """The winning config of ``key`` (memo → snapshot → server, see :attr:`resolver`); else
        ``default``, or the backend's default config.

        Every served record is checked first (:func:`tunecache.served.served_problem`); a config
        ``fits`` refuses is passed over. With ``verify`` (``verify(config)`` compares the
        config's outputs with the caller's reference and returns the
        :class:`~tunecache.schemas.CheckModel`), an answer is used only once its check passed,
        the first time this process would use it; a failed one is disputed with the server. A
        check that raises :class:`~tunecache.CheckUnavailable` (it could not run here) passes
        the answer over without a dispute, and is not run again for that answer for a minute.

        Never raises on a server failure and never blocks longer than the lookup timeout (plus
        what ``verify`` itself takes, once per key).
        """
        if default is None:
            default = default_config(key.backend)
        return self.resolver.resolve(key, default=default, fits=fits, verify=verify)

    async def alookup(
        self,
        key: Key,
        *,
        default: dict[str, Any] | None = None,
        fits: Fits | None = None,
        verify: Verify | None = None,
    ) -> LookupResult:
        """:meth:`lookup` for async code: it never blocks the event loop, nor waits longer
        than twice the lookup timeout (then ``default``), unless it verifies."""
        if default is None:
            default = default_config(key.backend)
        bound = None if verify else 2 * self.timeout.lookup
        return await self.resolver.aresolve(key, default=default, fits=fits, verify=verify,
                                            timeout=bound)  # fmt: skip

    def fetch(self, key: Key, *, timeout: float | None = None) -> RecordPublic | None:
        """The winner of exactly ``key`` from the server, ``None`` on a miss; no memo, no fallback;
        within ``timeout`` seconds in all (default: the lookup timeout).

        Raises:
            ServerError: the server is unreachable or gave a bad answer.
        """
        answer = self.fetch_answer(key, timeout=timeout)
        return None if answer is None else answer.record

    def fetch_answer(self, key: Key, *, timeout: float | None = None) -> LookupResponse | None:
        """The server's answer for ``key`` (the record, the rule and policy that matched), or
        ``None`` on a miss; within ``timeout`` seconds in all (default: the lookup timeout).

        Raises:
            ServerError: the server is unreachable, too slow, gave a bad answer, or is not a
                tunecache server (a 404 without its identity).
        """
        body = self._lookup_body(key)
        seconds = timeout or self.timeout.lookup
        try:
            with deadline(seconds), answer_limit(LOOKUP_ANSWER_BYTES):
                limits = self.timeout.per_operation(seconds, read=True)
                response = self._http.post("/v1/lookup", json=body, timeout=limits)
                if "bucket" in body and refuses_field(response, "bucket"):  # an older server
                    self.sends_bucket = False  # says no bucket: it serves exact shapes, as it did
                    response = self._http.post("/v1/lookup", json=self._lookup_body(key),
                                               timeout=limits)  # fmt: skip
                if missing(response):
                    return None
                if response.is_error or _redirect(response.status_code):
                    raise self._rejected("POST", "/v1/lookup", response)
                if response.status_code != 200:  # a hit is a 200: no other answer is one
                    raise ServerError(f"POST {self.url}/v1/lookup → {response.status_code}: a "
                                      "hit is a 200, a miss a 404; not read as an answer",
                                      status_code=response.status_code)  # fmt: skip
                return parse(LookupResponse, response, "/v1/lookup",  # says what is not tunecache
                             max_containers=LOOKUP_ANSWER_CONTAINERS)  # fmt: skip
        except httpx.TimeoutException as exc:  # "ReadTimeout: timed out" named no bound
            said = f"no answer within {seconds:g} s (the lookup's timeout)"
            raise ServerError(f"lookup at {self.url} timed out: {said}") from exc
        except (httpx.HTTPError, ValidationError, ValueError) as exc:
            raise ServerError(f"lookup at {self.url} failed: {type(exc).__name__}: {exc}"
                              f"{tls_hint(exc)}") from exc  # fmt: skip

    def _lookup_body(self, key: Key) -> dict[str, Any]:
        """A lookup's or miss report's body: the key, the version policy, the kernel's bucket."""
        bucket = caller_bucket(key.kernel) if self.sends_bucket else None  # None: as before
        body = LookupRequest(key=KeyModel.from_key(key), policy=self.policy, bucket=bucket)
        return body.model_dump(mode="json", by_alias=True, exclude=None if bucket else {"bucket"})

    # -- tuner and tooling calls (these raise ServerError) ----------------------------------
    def _call(
        self, method: str, path: str, timeout: float | None = None, *, read: bool = False,
        again: bool = False, small: bool = False, **kwargs: Any,
    ) -> httpx.Response:  # fmt: skip
        """One request within ``timeout`` seconds in all (default: the write timeout), its
        answer at most :data:`~tunecache.http.MAX_ANSWER_BYTES`; with ``small``, a success's at
        most one small object's (:data:`~tunecache.http.SMALL_ANSWER_BYTES`; an error's as any:
        an older server's 422 naming each of 20,000 trials lost its status, and the outbox took
        it for an outage). A write (a read with ``again``) the server sheds (503, Retry-After)
        is sent again in that time."""
        seconds = timeout or self.timeout.write
        try:
            with deadline(seconds), answer_limit(MAX_ANSWER_BYTES):
                for sent in itertools.count(1):
                    request = self._http.build_request(
                        method, path, timeout=self.timeout.per_operation(seconds, read=read),
                        **kwargs,
                    )  # fmt: skip
                    response = self._http.send(request, stream=True)
                    most = SMALL_ANSWER_BYTES if small and not response.is_error else None
                    try:
                        with answer_limit(most or MAX_ANSWER_BYTES):
                            response.read()
                    finally:
                        response.close()
                    wait = shed_wait(response, sent)
                    left = time_left()
                    if (read and not again) or wait is None or left is None or wait >= left:
                        break
                    time.sleep(wait)
        except httpx.HTTPError as exc:
            raise ServerError(f"{method} {self.url}{path} failed: {exc}{tls_hint(exc)}") from exc
        if response.is_error or _redirect(response.status_code):
            raise self._rejected(method, path, response)
        return response

    def _rejected(self, method: str, path: str, response: httpx.Response) -> ServerError:
        """:func:`~tunecache.http.rejected`, saying which token a 401 refused and where; a
        redirect is never followed (the token goes where it was sent), nor its body read."""
        if _redirect(response.status_code):
            to = shown(response.headers.get("location", "")[:200])
            return ServerError(f"{method} {self.url}{path}: the server redirected to {to!r}, not "
                               "followed (is the URL right: http or https, a path prefix?)",
                               status_code=response.status_code)  # fmt: skip
        exc = rejected(method, path, response)
        if exc.status_code != 401 or exc.foreign:
            return exc
        return ServerError(f"{exc} ({self._token_said})", status_code=401,
                           retry_after=exc.retry_after)  # fmt: skip

    def upload(self, record: RecordCreate) -> UploadResult:
        """Uploads a tuning result.

        Raises:
            ServerError: the server is unreachable or rejected the record.
        """
        # The late fields at their defaults left out: a server older than a field it need not
        # hear of (``timing.noisy: false``, ``times_ms: []``) refused the whole upload (422).
        body = without_late_defaults(record.model_dump(mode="json", by_alias=True))
        response = self._call("POST", "/v1/records", small=True, json=body)
        return parse(UploadResult, response, "/v1/records")

    def upload_later(self, record: RecordCreate) -> bool:
        """Uploads ``record`` from a background thread: the caller never waits. While the server
        is down after a failed call it waits, and is sent when the server may be asked again
        (see :meth:`ServerSource.send_later <tunecache.server_source.ServerSource.send_later>`);
        ``False`` only when the queue is full. A failed upload is a warning; :meth:`close` waits
        a few seconds for uploads still queued and says how many were not sent. Until the server
        has it, the record is kept in the outbox (:class:`tunecache.outbox.Later`): one never
        sent waits there for ``tunecache push``. One the server stores but serves only once a
        verifier passes it (its verified policy) is said, once a client."""
        what = f"upload of {record.key.kernel} ({record.key.backend})"
        later = Later(self.url, record, what)  # kept in the outbox till the server has it
        queued = self.server.send_later(what, lambda: self.say_pending(later.send(self)),
                                        loud=True, lost=later.lost)  # fmt: skip
        if not queued:
            later.lost()
        return queued

    def say_pending(self, result: UploadResult) -> UploadResult:
        """Warns, once a client, where ``result`` is stored but not served (pending under the
        server's verified policy): a team's every launch would say it. Returns ``result``."""
        if stored_unserved(result) and not self.said_pending:
            self.said_pending = True
            logger.warning("%s: record #%d is stored but not served: this server serves "
                           "verified records only (served once `tunecache daemon --verify` "
                           "passes it; uploads of a trusted token are served at once)",
                           self.url, result.record_id)  # fmt: skip
        return result

    def drain(self, timeout: float = 5.0) -> bool:
        """Waits until the background calls queued so far (uploads, miss reports, disputes) are
        sent; whether they were within ``timeout`` seconds."""
        return self.server.drain(timeout)

    def report_miss(self, key: Key, *, timeout: float | None = None) -> JobEnqueued:
        """Asks the server to tune ``key``: it queues a job, or answers with the one queued.

        Raises:
            ServerError: the server is unreachable or refused (429: over its rate limit).
        """
        body = self._lookup_body(key)
        response = self._call("POST", "/v1/misses", timeout, read=True, small=True, json=body)
        return parse(JobEnqueued, response, "/v1/misses")

    def dispute(
        self, record_id: int, dispute: DisputeCreate, *, timeout: float | None = None
    ) -> DisputeResult:
        """Tells the server that record ``record_id`` failed a consumer's check (it then stops
        serving it under every policy until a verifier re-verifies it). Needs a token.

        Raises:
            ServerError: the server is unreachable or refused (401 without a token).
        """
        body = dispute.model_dump(mode="json", by_alias=True)
        path = f"/v1/records/{record_id}/disputes"
        return parse(DisputeResult, self._call("POST", path, timeout, read=True, small=True,
                                                json=body), path)  # fmt: skip

    def list_records(self, *, timeout: float | None = None, **filters: Any) -> RecordList:
        """Records matching ``filters`` (``kernel``, ``backend``, ``dtype``, ``device_arch`` …),
        within ``timeout`` (default: the write timeout)."""
        params = {k: v for k, v in filters.items() if v is not None}
        response = self._call("GET", "/v1/records", timeout, params=params)
        bound = answers.record_page(params.get("limit"))  # at most ``limit`` records
        return parse(RecordList, response, "/v1/records", max_containers=bound)

    def get_record(self, record_id: int) -> RecordPublic:
        """One record with all its trials."""
        path = f"/v1/records/{record_id}"
        response = self._call("GET", path)
        return parse(RecordPublic, response, path, max_containers=answers.RECORD_CONTAINERS)

    def export_snapshot(
        self, device_arch: str, *, if_none_match: str | None = None, **filters: str | None
    ) -> tuple[dict[str, Any] | None, str]:
        """The winners of ``device_arch`` as a snapshot document, and its ETag.

        Args:
            device_arch: the device arch, e.g. ``"sm_90"``.
            if_none_match: the ETag of the snapshot held already: an unchanged one is not sent.
            **filters: ``device_name``, ``kernel``, ``backend`` to narrow it (``None``: unset).

        Returns:
            ``(document, etag)``; :func:`tunecache.snapshot.save_snapshot` writes the document.
            The document is ``None`` when it has not changed since ``if_none_match``.

        Raises:
            ServerError: the server is unreachable, rejected the filters, or sent no snapshot.
        """
        params = {"device_arch": device_arch, **{k: v for k, v in filters.items() if v is not None}}
        headers = {"If-None-Match": if_none_match} if if_none_match else {}
        response = self._call("GET", "/v1/snapshot", params=params, headers=headers)
        if response.status_code == NOT_MODIFIED and not if_none_match:  # "up to date" of none
            raise ServerError("GET /v1/snapshot answered 304 Not Modified where no ETag was sent")
        if response.status_code == NOT_MODIFIED:
            return None, response.headers.get("etag", if_none_match or "")
        try:
            document: dict[str, Any] = answers.json_answer(
                response, "/v1/snapshot", answers.SNAPSHOT_CONTAINERS)  # fmt: skip
            snapshot = SnapshotPublic.model_validate(document, context=SERVED)
        except ValidationError as exc:  # one line, not pydantic's with the data
            if not is_tunecache(response):
                raise foreign(response, "/v1/snapshot") from exc
            why = first_error(exc)
            raise ServerError(f"GET /v1/snapshot sent no valid snapshot: {why}") from exc
        asked = {k: v for k, v in params.items() if k in SnapshotFilters.model_fields}
        if snapshot.filters.model_dump(exclude_none=True) != asked:  # another arch's, written
            raise ServerError("GET /v1/snapshot sent a snapshot of other filters than asked")
        return document, response.headers.get("etag", "")

    def import_snapshot(self, document: Mapping[str, Any] | SnapshotPublic) -> dict[str, int]:
        """Merges a snapshot into the server: the faster validated record of each key wins.

        Returns:
            ``{"imported": n, "winners_changed": m}``.

        Raises:
            ServerError: the server is unreachable or rejected the snapshot (413, 422).
        """
        if isinstance(document, SnapshotPublic):
            document = document.model_dump(mode="json", by_alias=True)
        response = self._call("POST", "/v1/snapshot", small=True, json=dict(document))
        return parse(SnapshotImportResult, response, "/v1/snapshot").model_dump()
