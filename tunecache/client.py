"""The run-time client: look a key up, fall back quietly, never break the caller.

A lookup tries the in-process memo, then a local snapshot file if one was given (see
:mod:`tunecache.snapshot`), then the server (bounded by a :class:`Timeout`), then the caller's
default config. Network failures, timeouts and bad answers are logged once and answered
with the default; after a failure the server is not asked again for ``retry_after`` seconds, so a
dead server costs one timeout, not one per call.

Example:
    >>> from tunecache import key_for
    >>> key = key_for("matmul", "tvm", {"M": 64, "N": 64, "K": 64}, "float32")
    >>> with Client("http://127.0.0.1:8765") as client:  # doctest: +SKIP
    ...     hit = client.lookup(key, default={"schedule": "default"})
    ...     hit.source, hit.config
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import ValidationError

from tunecache.defaults import default_config
from tunecache.errors import InvalidInput, ServerError
from tunecache.key import Key
from tunecache.policies import VersionPolicy
from tunecache.rules import Rule, best
from tunecache.schemas import (
    JobEnqueued,
    KeyModel,
    LookupRequest,
    LookupResponse,
    RecordCreate,
    RecordList,
    RecordPublic,
    SnapshotImportResult,
    SnapshotPublic,
    UploadResult,
)
from tunecache.settings import Settings
from tunecache.tokens import Scope, TokenCreate, TokenCreated, TokenList, TokenPublic

logger = logging.getLogger(__name__)
Source = Literal["memo", "snapshot", "server", "default"]


@dataclass(frozen=True)
class Timeout:
    """Seconds a lookup may spend connecting and reading; writes get ``write`` seconds in all."""

    lookup: float = 0.5
    connect: float | None = None  # defaults to ``lookup``
    write: float = 60.0

    def for_lookup(self) -> httpx.Timeout:
        return httpx.Timeout(self.lookup, connect=self.connect or self.lookup)

    def for_write(self) -> httpx.Timeout:
        return httpx.Timeout(self.write, connect=self.connect or min(self.write, 5.0))


@dataclass(frozen=True)
class LookupResult:
    """What a lookup found: the config to launch, where it came from, and the record on a hit.

    ``record`` is the server's record on a memo or server hit; a snapshot hit has none (a snapshot
    holds the winners' data without server ids), but is still a :attr:`hit`. ``rule`` says which
    lookup rule matched (:mod:`tunecache.rules`: ``exact``, ``same_arch``, ``bucket``) and
    ``policy`` under which version policy; both are ``None`` for the default.
    """

    config: dict[str, Any] | None
    source: Source
    record: RecordPublic | None = None
    rule: Rule | None = None
    policy: VersionPolicy | None = None

    @property
    def hit(self) -> bool:
        return self.source != "default"


class Client:
    """A client of one tunecache server.

    Args:
        url: the server, e.g. ``http://127.0.0.1:8765``; ``TUNECACHE_URL`` when omitted.
        timeout: a :class:`Timeout`, or seconds for lookups.
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
            from before asking the server; read once, on the first lookup. A missing or corrupt
            file is logged once and ignored.
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
        snapshot: Path | None = None,
    ) -> None:
        need_env = url is None or timeout is None or token is None
        settings = Settings.from_env() if need_env else None
        self.url = (url or (settings.url if settings else "")).rstrip("/")
        if isinstance(timeout, int | float):
            timeout = Timeout(lookup=float(timeout))
        self.timeout = timeout or Timeout(lookup=settings.timeout if settings else 0.5)
        self.retry_after = retry_after
        self.miss_ttl = miss_ttl
        self.policy: VersionPolicy = policy
        self.report_misses = report_misses
        token = token if token is not None else (settings.token if settings else None)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, transport=transport, headers=headers)
        self._lock = threading.Lock()
        self._memo: dict[str, LookupResult] = {}
        self._misses: dict[str, float] = {}
        self._down_until = 0.0
        self._warned = False
        self._snapshot_path = snapshot
        self._snapshot: list[tuple[dict[str, Any], RecordCreate]] | None = None
        self._snapshot_answers: dict[str, LookupResult | None] = {}
        self._snapshot_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- run-time lookups ------------------------------------------------------------------
    def lookup(self, key: Key, *, default: dict[str, Any] | None = None) -> LookupResult:
        """The winning config of ``key``; else ``default``, or the backend's default config.

        Never raises on a server failure and never blocks longer than the lookup timeout.
        """
        if default is None:
            default = default_config(key.backend)
        digest = key.digest()
        now = time.monotonic()
        with self._lock:
            if (memo := self._memo.get(digest)) is not None:
                return memo
        if (local := self._from_snapshot(key, digest)) is not None:
            return local
        with self._lock:
            if self._misses.get(digest, -1.0) > now or self._down_until > now:
                return LookupResult(config=default, source="default")
        answer = self._fetch(key)
        with self._lock:
            if answer is not None:
                record = answer.record
                self._memo[digest] = LookupResult(record.config, "memo", record, answer.match,
                                                  answer.policy)  # fmt: skip
                return LookupResult(record.config, "server", record, answer.match, answer.policy)
            missed = self._down_until <= now  # the server answered: a miss, not a failure
            if missed:
                self._misses[digest] = now + self.miss_ttl
        if missed and self.report_misses:
            try:
                self.report_miss(key, timeout=self.timeout.for_lookup())
            except ServerError as exc:
                logger.debug("miss of %s not reported: %s", key.short(), exc)
        return LookupResult(config=default, source="default")

    def _from_snapshot(self, key: Key, digest: str) -> LookupResult | None:
        """The snapshot's answer for ``key`` by the lookup rules (offline), if it has one.

        Answers are kept per key: the rules scan the snapshot once per key, not per lookup.
        """
        if self._snapshot is None:
            with self._snapshot_lock:
                if self._snapshot is None:
                    self._snapshot = self._load_snapshot()
        if not self._snapshot:
            return None
        if digest not in self._snapshot_answers:
            found = best(key.to_json(), self._snapshot, self.policy)
            answer = None
            if found is not None:
                record, rule = found
                answer = LookupResult(record.config, "snapshot", None, rule, self.policy)
            with self._lock:
                self._snapshot_answers[digest] = answer
        return self._snapshot_answers[digest]

    def _load_snapshot(self) -> list[tuple[dict[str, Any], RecordCreate]]:
        if self._snapshot_path is None:
            return []
        from tunecache.snapshot import index_snapshot, load_snapshot

        try:
            index = index_snapshot(load_snapshot(self._snapshot_path))
        except InvalidInput as exc:
            logger.warning("%s; ignoring the snapshot", exc)
            return []
        logger.debug("snapshot %s: %d winners", self._snapshot_path, len(index))
        return [(r.key.model_dump(mode="json", by_alias=True), r) for r in index.values()]

    def _fetch(self, key: Key) -> LookupResponse | None:
        try:
            return self.fetch_answer(key, timeout=self.timeout.for_lookup())
        except ServerError as exc:
            self._failed(exc)
            return None

    def fetch(self, key: Key, *, timeout: httpx.Timeout | None = None) -> RecordPublic | None:
        """The winner of exactly ``key`` from the server, ``None`` on a miss; no memo, no fallback.

        Raises:
            ServerError: the server is unreachable or gave a bad answer.
        """
        answer = self.fetch_answer(key, timeout=timeout)
        return None if answer is None else answer.record

    def fetch_answer(
        self, key: Key, *, timeout: httpx.Timeout | None = None
    ) -> LookupResponse | None:
        """The server's answer for ``key`` (the record, the rule and policy that matched), or
        ``None`` on a miss.

        Raises:
            ServerError: the server is unreachable or gave a bad answer.
        """
        body = self._lookup_body(key)
        try:
            response = self._http.post(
                "/v1/lookup", json=body, timeout=timeout or self.timeout.for_lookup()
            )
            if response.status_code == 404:
                return None
            if response.is_error:
                raise _rejected("POST", "/v1/lookup", response)
            return LookupResponse.model_validate_json(response.content)
        except (httpx.HTTPError, ValidationError, ValueError) as exc:
            raise ServerError(f"lookup at {self.url} failed: {type(exc).__name__}: {exc}") from exc

    def _lookup_body(self, key: Key) -> dict[str, Any]:
        """The body of a lookup or a miss report: the key and this client's version policy."""
        request = LookupRequest(key=KeyModel.from_key(key), policy=self.policy)
        return request.model_dump(mode="json", by_alias=True)

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            self._down_until = time.monotonic() + self.retry_after
            first, self._warned = not self._warned, True
        log = logger.warning if first else logger.debug
        log("%s; using default configs, retrying in %.0f s", exc, self.retry_after)

    # -- tuner and tooling calls (these raise ServerError) ----------------------------------
    def _call(
        self, method: str, path: str, timeout: httpx.Timeout | None = None, **kwargs: Any
    ) -> httpx.Response:
        try:
            timeout = timeout or self.timeout.for_write()
            response = self._http.request(method, path, timeout=timeout, **kwargs)
        except httpx.HTTPError as exc:
            raise ServerError(f"{method} {self.url}{path} failed: {exc}") from exc
        if response.is_error:
            raise _rejected(method, path, response)
        return response

    def upload(self, record: RecordCreate) -> UploadResult:
        """Uploads a tuning result.

        Raises:
            ServerError: the server is unreachable or rejected the record.
        """
        body = record.model_dump(mode="json", by_alias=True)
        return UploadResult.model_validate_json(
            self._call("POST", "/v1/records", json=body).content
        )

    def report_miss(self, key: Key, *, timeout: httpx.Timeout | None = None) -> JobEnqueued:
        """Asks the server to tune ``key``: it queues a job, or answers with the one queued.

        Raises:
            ServerError: the server is unreachable or refused (429: over its rate limit).
        """
        body = self._lookup_body(key)
        response = self._call("POST", "/v1/misses", json=body, timeout=timeout)
        return JobEnqueued.model_validate_json(response.content)

    def list_records(self, **filters: Any) -> RecordList:
        """Records matching ``filters`` (``kernel``, ``backend``, ``dtype``, ``device_arch`` …)."""
        params = {k: v for k, v in filters.items() if v is not None}
        return RecordList.model_validate_json(
            self._call("GET", "/v1/records", params=params).content
        )

    def get_record(self, record_id: int) -> RecordPublic:
        """One record with all its trials."""
        return RecordPublic.model_validate_json(
            self._call("GET", f"/v1/records/{record_id}").content
        )

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
        if response.status_code == 304:
            return None, response.headers.get("etag", if_none_match or "")
        try:
            document: dict[str, Any] = response.json()
            SnapshotPublic.model_validate(document)
        except (ValidationError, ValueError) as exc:
            raise ServerError(f"GET /v1/snapshot sent no valid snapshot: {exc}") from exc
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
        response = self._call("POST", "/v1/snapshot", json=dict(document))
        try:
            return SnapshotImportResult.model_validate_json(response.content).model_dump()
        except ValidationError as exc:
            raise ServerError(f"POST /v1/snapshot gave a bad answer: {exc}") from exc

    # -- token management (needs a token with the admin scope) ---------------------------
    def create_token(self, name: str, scope: Scope) -> TokenCreated:
        """A new token; the answer holds it in clear, for the only time."""
        body = TokenCreate(name=name, scope=scope).model_dump()
        return TokenCreated.model_validate_json(self._call("POST", "/v1/tokens", json=body).content)

    def list_tokens(self, *, include_revoked: bool = False) -> list[TokenPublic]:
        params = {"include_revoked": "true"} if include_revoked else {}
        response = self._call("GET", "/v1/tokens", params=params)
        return TokenList.model_validate_json(response.content).items

    def revoke_token(self, token_id: int) -> TokenPublic:
        return TokenPublic.model_validate_json(
            self._call("DELETE", f"/v1/tokens/{token_id}").content
        )

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/health").json()
        return result


def _rejected(method: str, path: str, response: httpx.Response) -> ServerError:
    """The server's error answer as a :class:`ServerError` carrying its status and reason."""
    try:
        detail = response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        detail = response.text
    return ServerError(
        f"{method} {path} → {response.status_code}: {detail}", status_code=response.status_code
    )
