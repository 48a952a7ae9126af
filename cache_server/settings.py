"""Server settings, read from ``TUNECACHE_SERVER_*`` environment variables.

- ``TUNECACHE_SERVER_DB``: SQLAlchemy database URL (default: a SQLite file in the user cache dir);
  ``postgresql://`` and ``postgres://`` (Heroku's, libpq's) mean PostgreSQL through psycopg 3
- ``TUNECACHE_SERVER_STATEMENT_SECONDS``: on PostgreSQL, the longest one of the API's statements
  may run, or wait for a lock (default 5; 0: no bound); past it the request gets 503 with
  ``Retry-After``, as when the database does not answer. Migrations are not bounded.
- ``TUNECACHE_SERVER_HOST``: the address ``tunecache serve`` binds (default ``127.0.0.1``)
- ``TUNECACHE_SERVER_PORT``: the port ``tunecache serve`` binds (default 8765)
- ``TUNECACHE_SERVER_MAX_BODY``: largest request body a ``write`` or ``admin`` token may send, in
  bytes (default 16 MiB)
- ``TUNECACHE_SERVER_MAX_BODY_READ``: largest body a ``read`` or ``verify`` token may send
  (default 1 MiB)
- ``TUNECACHE_SERVER_MAX_BODY_ANONYMOUS``: largest body a request without a token may send
  (default 64 KiB: a lookup or a miss report is a few KB)
- ``TUNECACHE_SERVER_MAX_JSON_DEPTH``: deepest nesting of a JSON body (default 64)
- ``TUNECACHE_SERVER_MAX_JSON_ELEMENTS``: most values one JSON body may hold (default 1,000,000)
- ``TUNECACHE_SERVER_HEADER_SECONDS``: seconds a request's headers may take to arrive, from the
  connection (or the previous answer on it) on (default 10); slower, the connection is closed,
  so a client that never finishes its headers cannot hold connections
  (:mod:`cache_server.header_deadline`)
- ``TUNECACHE_SERVER_MAX_CONNECTIONS_PER_ADDRESS``: connections one client address may hold
  open to one server process (default 256); beyond it, 429 at once and the connection closed
  (:mod:`cache_server.address_cap`); behind a proxy, whose address every client has, raise it
- ``TUNECACHE_SERVER_BODY_SECONDS``: seconds a request's body may take to arrive (default 10);
  slower gets 408, so a client that trickles its body cannot hold a request slot
- ``TUNECACHE_SERVER_MAX_IN_FLIGHT``: requests one server process works on at once (default 2:
  a request is mostly Python, and Python runs one thread at a time; more server processes,
  ``--workers``, add capacity)
- ``TUNECACHE_SERVER_MAX_WAIT``: seconds a request may wait for one of those; a request that
  would wait longer gets 503 with ``Retry-After`` at once (default 0.02)
- ``TUNECACHE_SERVER_RETRY_AFTER``: the seconds a 503 tells the client to wait (default 1)
- ``TUNECACHE_SERVER_LIST_LIMIT``: most records one list request returns (default 1000)
- ``TUNECACHE_SERVER_ANSWER_BYTES``: bytes of stored JSON (records', artifacts' values, jobs'
  keys and errors) one listing or dashboard page may return (default 8 MiB;
  :mod:`cache_server.budget`): a page cut short is shorter, at least one item
- ``TUNECACHE_SERVER_SNAPSHOT_BYTES``: bytes of stored records one snapshot export may hold
  (default 128 MiB; counted before any is read): more is a 422 that says to narrow it
- ``TUNECACHE_SERVER_FORWARDED_ALLOW_IPS``: the proxies (addresses or networks, comma-separated)
  whose ``X-Forwarded-For`` names the caller (default: none). Without one, a caller is its
  connection's address: uvicorn's default trusted any client on loopback, so one local process
  could name itself anew with each request and spend other callers' limits
- ``TUNECACHE_SERVER_WORKERS``: server processes ``tunecache serve`` runs (default 1)
- ``TUNECACHE_SERVER_MISS_REPORTS_PER_MINUTE``: miss reports one caller (token, or address) may
  send a minute to one server process (default 120); more get 429
- ``TUNECACHE_SERVER_MISS_JOBS_PER_MINUTE``: new jobs misses may create a minute, counted in the
  database across every server process (default 60); reports of keys already queued don't count
- ``TUNECACHE_SERVER_MISS_JOBS_CALLER_SHARE``: the fraction of those one caller's misses may
  create (default 0.25: 15 of 60, at least 1), also counted in the database; so one caller cannot
  spend every other caller's budget
- ``TUNECACHE_SERVER_JOBS_OPEN_PER_TOKEN``: open (queued or running) jobs one non-admin token
  may have queued through ``POST /v1/jobs`` or its misses (default 10,000: a pre-tune of a larger
  manifest needs an admin token or more); past it a new job is
  refused (429) until some are done or failed. An admin token is not bounded
- ``TUNECACHE_SERVER_JOB_PRIORITY_MAX``: the highest priority a non-admin token's job gets
  (default 0, what ``tunecache pretune`` sends); more is lowered to it. Only an admin token
  queues ahead of everyone's pre-tuning
- ``TUNECACHE_SERVER_JOB_ATTEMPTS_MAX``: the most attempts a non-admin token's job gets (default
  5; clients ask for 3); more is lowered to it
- ``TUNECACHE_SERVER_TOKEN_BYTES``: bytes of records and artifacts one non-admin token may store
  (default 4 GiB; :mod:`cache_server.quota`): an upload past it is refused (403, nothing stored).
  Records are never deleted, so a token's usage only grows; an admin token is not bounded
- ``TUNECACHE_SERVER_DISPUTES_PER_MINUTE``: disputes one token may send a minute to one server
  process (default 30); more get 429
- ``TUNECACHE_SERVER_READS``: ``open`` (default: lookups and other reads need no token) or
  ``token`` (they need a token with the ``read`` scope). Writes always need ``write``.
- ``TUNECACHE_SERVER_POLICY``: which records lookups and snapshots serve: ``validated``
  (default: records their uploader validated, unless disputed or rejected) or ``verified``
  (only records a verifier re-checked, or that a trusted token uploaded)
- ``TUNECACHE_SERVER_BOOTSTRAP_TOKEN``: an ``admin`` token (at least 32 characters) the server
  stores, hashed, at start-up if it does not know it yet; for deployments that provision secrets
  (docker compose). Revoking it works as for any token.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Final, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tunecache.schemas import MAX_LISTED
from tunecache.settings import DEFAULT_PORT, default_db_url, without_userinfo
from tunecache.tokens import MIN_TOKEN_CHARS

PROMETHEUS_DIR_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's, not ours
STATEMENT_SECONDS: Final = 5.0  # TUNECACHE_SERVER_STATEMENT_SECONDS's default
VERSION_WAIT_SECONDS: Final = 86_400.0  # TUNECACHE_SERVER_VERSION_WAIT_SECONDS's default: a day


def prometheus_dir() -> str | None:
    """``PROMETHEUS_MULTIPROC_DIR``: where prometheus_client keeps several processes' metrics."""
    return os.environ.get(PROMETHEUS_DIR_ENV) or None


def set_prometheus_dir(path: str | None) -> None:
    """Sets (or, with ``None``, unsets) it for the worker processes started after this."""
    if path is None:
        os.environ.pop(PROMETHEUS_DIR_ENV, None)
    else:
        os.environ[PROMETHEUS_DIR_ENV] = path


class ServerSettings(BaseSettings):
    """Typed server settings; a bad value raises ``ValueError`` naming the variable."""

    model_config = SettingsConfigDict(
        env_prefix="TUNECACHE_SERVER_", env_ignore_empty=True, frozen=True
    )

    db: str = Field(default_factory=default_db_url)
    # A table locked (an operator's LOCK TABLE, a migration) held each request that needed it, and
    # its API slot, for as long as the lock lasted: cache_server.db.make_engine bounds both.
    statement_seconds: float = Field(default=STATEMENT_SECONDS, ge=0, le=3600)
    host: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535)
    max_body: int = Field(default=16 * 2**20, gt=0)
    max_body_read: int = Field(default=2**20, gt=0)
    max_body_anonymous: int = Field(default=64 * 2**10, gt=0)
    max_json_depth: int = Field(default=64, ge=8, le=1000)
    max_json_elements: int = Field(default=1_000_000, ge=1000)
    header_seconds: float = Field(default=10.0, gt=0, le=3600)
    body_seconds: float = Field(default=10.0, gt=0, le=3600)
    drain_seconds: float = Field(default=30.0, gt=0, le=3600)  # a client reading nothing: cut off
    max_connections_per_address: int = Field(default=256, ge=1, le=1_000_000)
    # All connections of a server process; None: its open-file limit (raised to the hard limit)
    # less the descriptors of its own files (cache_server.address_cap).
    max_connections: int | None = Field(default=None, ge=16, le=10_000_000)
    max_in_flight: int = Field(default=2, ge=1, le=1000)
    max_wait: float = Field(default=0.02, ge=0, le=60)
    retry_after: int = Field(default=1, ge=1, le=3600)
    list_limit: int = Field(default=1000, gt=0, le=MAX_LISTED)  # what a client reads at most
    answer_bytes: int = Field(default=8 * 2**20, ge=1024, le=2**31 - 1)  # an INTEGER in SQL
    snapshot_bytes: int = Field(default=128 * 2**20, ge=1024, le=2**40)
    # Winners one shape bucket may hold (kernel, source, backend, dtype, arch, bucketed shape; a
    # user's kernel's every size rounded up, its bucket unknown here: rules.bucket_digest):
    # a lookup other than an exact hit ranks them all, so a write token that filled one bucket
    # with 20,000 (one torch version each) made its lookups take 0.7 s instead of 8 ms. A new
    # key beyond it is refused (409), a trusted or admin token's beyond twice it, and one token's
    # past half of it (cache_server.buckets); a key already there may still get a faster record.
    bucket_winners: int = Field(default=4096, ge=1, le=1_000_000)
    workers: int = Field(default=1, ge=1, le=64)
    forwarded_allow_ips: str = ""
    miss_reports_per_minute: int = Field(default=120, ge=1, le=1_000_000)
    miss_jobs_per_minute: int = Field(default=60, ge=1, le=1_000_000)
    miss_jobs_caller_share: float = Field(default=0.25, gt=0, le=1)
    # What a non-admin token's POST /v1/jobs may ask (cache_server.api.routes.jobs.create_job):
    # one write token queued 500 jobs of priority 1000, 100 attempts and a million trials each in
    # 2 s, and daemons claimed nothing else for as long as they ran.
    jobs_open_per_token: int = Field(default=10_000, ge=1, le=1_000_000)
    job_priority_max: int = Field(default=0, ge=-1000, le=1000)
    job_attempts_max: int = Field(default=5, ge=1, le=100)
    # What a non-admin token may store (cache_server.quota): a write token stored 14.3 MiB a
    # second of records that never won, unbounded. A TVM tune of 200 trials sent 395 KB (a
    # matmul here): 4 GiB holds some 10,000 of them, as many keys as the token may queue.
    token_bytes: int = Field(default=4 * 2**30, ge=2**20, le=2**62)
    disputes_per_minute: int = Field(default=30, ge=1, le=1_000_000)
    # A failed job waits this long before it may be claimed again, doubling with each attempt
    # (capped at an hour): a job that fails at once does not spend its attempts in a second.
    retry_seconds: float = Field(default=30.0, ge=0, le=3600)
    # A job waits this long (since it was last queued, claimed, renewed or failed) for a worker
    # of its kernel's version (a claim names the versions it runs), then any worker may claim it,
    # and one of another version fails an attempt of it: an old version's jobs, left when every
    # daemon was upgraded, stayed queued for good, each counted among its token's open jobs.
    version_wait_seconds: float = Field(default=VERSION_WAIT_SECONDS, ge=0, le=30 * 86_400)
    reads: Literal["open", "token"] = "open"
    policy: Literal["validated", "verified"] = "validated"
    bootstrap_token: str | None = Field(default=None, min_length=MIN_TOKEN_CHARS, repr=False)

    @property
    def miss_jobs_per_caller(self) -> int:
        """New jobs one caller's misses may create a minute: its share of the server's."""
        return max(1, int(self.miss_jobs_per_minute * self.miss_jobs_caller_share))

    def export(self) -> None:
        """Puts these settings into this process's environment, for the worker processes that
        ``tunecache serve --workers N`` starts (each builds its app from the environment)."""
        for name, value in self.model_dump(exclude_none=True).items():
            os.environ[f"TUNECACHE_SERVER_{name.upper()}"] = str(value)

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _proxies(cls, value: str) -> str:
        """Each one an address or a network (no ``*``: every client would name itself)."""
        proxies = []
        for proxy in (part.strip() for part in value.split(",") if part.strip()):
            try:  # as uvicorn reads them: "10.0.0.1/8" (host bits set) it took for a name
                parsed = ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise ValueError(f"{proxy!r} is not an IP address or network") from None
            proxies.append(str(parsed) if "/" in proxy else str(parsed.network_address))
        return ",".join(proxies)

    @field_validator("bootstrap_token")
    @classmethod
    def _sendable(cls, value: str | None) -> str | None:
        """A token a client can send: printable ASCII with no space. One pasted with a trailing
        newline (a secret file, a ``.env``) was stored, and no client could ever send it: the
        operator was locked out."""
        if value is not None and not all("!" <= c <= "~" for c in value):
            raise ValueError("holds a space, a newline or a character outside printable ASCII "
                             "(a pasted newline?): no client could send it")  # fmt: skip
        return value

    @field_validator("db")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        # postgresql:// alone, SQLAlchemy would drive with psycopg2 (we ship psycopg 3), and
        # postgres:// (libpq's, Heroku's) it refuses outright: both mean psycopg 3.
        for plain in ("postgresql://", "postgres://", "postgres+psycopg://"):
            if value.startswith(plain):
                return "postgresql+psycopg://" + value.removeprefix(plain)
        if not value.startswith(("sqlite://", "postgresql+psycopg://")):
            shown = without_userinfo(value)  # never a password in a message
            file = "" if "://" in value else f" (a SQLite file: sqlite:///{value})"
            raise ValueError(
                f"database URL {shown!r} must be sqlite://, postgresql:// or postgres://{file}"
            )
        return value
