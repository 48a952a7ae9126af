"""SQLAlchemy 2.0 models: every uploaded record, its trials, and the winner of each key."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every database.

    PostgreSQL keeps the zone; SQLite stores the UTC time without one and hands back a naive
    datetime. Values are stored in UTC and always read back aware, so every time on the wire
    carries its zone.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(UTC)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class RecordRow(Base):
    """One uploaded tuning result (validated or not), with the key's columns for filtering."""

    __tablename__ = "records"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key_hash: Mapped[str] = mapped_column(String(64), index=True)
    kernel: Mapped[str] = mapped_column(String(128))
    backend: Mapped[str] = mapped_column(String(16))
    dtype: Mapped[str] = mapped_column(String(32))
    device_arch: Mapped[str] = mapped_column(String(128))
    device_name: Mapped[str] = mapped_column(String(128))
    key: Mapped[dict[str, Any]]
    config: Mapped[dict[str, Any]]
    config_summary: Mapped[str] = mapped_column(String(256), default="")
    time_ms: Mapped[float] = mapped_column(Float)
    timing: Mapped[dict[str, Any]]
    baselines: Mapped[list[Any]]
    validated: Mapped[bool] = mapped_column(Boolean)
    max_rel_error: Mapped[float | None] = mapped_column(Float, nullable=True)
    validation: Mapped[dict[str, Any]]
    search: Mapped[dict[str, Any]]
    provenance: Mapped[dict[str, Any]]
    trial_count: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # tunecache.rules.bucket_digest of the key: the rows a non-exact lookup may match.
    bucket_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Trust (tunecache.schemas.RecordStatus): pending | verified | disputed | rejected.
    status: Mapped[str] = mapped_column(String(16), default="pending")
    uploaded_by: Mapped[str | None] = mapped_column(String(128), nullable=True)  # token name
    # The token (its name) that imported the record from a snapshot (cache_server.snapshots);
    # ``uploaded_by`` is then the uploader the snapshot named (None: it named none). NULL: uploaded.
    imported_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    verification: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    disputes: Mapped[int] = mapped_column(Integer, default=0)
    # A verifier's lease on the record while it re-checks it.
    verify_owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    verify_token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # claimed with
    verify_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    verify_attempts: Mapped[int] = mapped_column(Integer, default=0)
    verify_claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # cache_server.queries.upload_digest: an upload sent twice is stored once (None before 0012).
    upload_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # tunecache.canonical.digest of the config: a key's records of one config share findings
    # (cache_server.twins; None before 0013 for a config that is not plain JSON).
    config_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # The token (its id) on whose word alone the record is served: its uploader's, or for a
    # snapshot's its importer's, until a verifier of this server passes it (then NULL). Revoking
    # that token with ``withdraw`` disputes the record (cache_server.withdrawal).
    vouched_by: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The verify token (its id) whose finding decided the record last: its pass or rejection, or
    # a twin's pass that settled its dispute. Revoking that token with ``withdraw`` disputes the
    # record again (cache_server.withdrawal); NULL where no verifier of this server decided it.
    checked_by: Mapped[int | None] = mapped_column(Integer, nullable=True)

    __table_args__ = (
        Index("ix_records_kernel_backend_dtype", "kernel", "backend", "dtype"),
        Index("ix_records_vouched_by", "vouched_by"),
        Index("ix_records_checked_by", "checked_by"),
        Index("ix_records_key_config", "key_hash", "config_digest"),
        Index("ux_records_upload_digest", "upload_digest", unique=True),
        Index("ix_records_bucket_hash", "bucket_hash"),
        Index("ix_records_verify_queue", "status", "device_arch", "backend"),
    )


class TrialRow(Base):
    """One candidate a search evaluated; kept for analysis and warm starts."""

    __tablename__ = "trials"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    record_id: Mapped[int] = mapped_column(ForeignKey("records.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(32))
    time_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str] = mapped_column(Text, default="")


class _Winner:
    """A key's winning record under one serving policy (one table per policy)."""

    key_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    record_id: Mapped[int] = mapped_column(ForeignKey("records.id", ondelete="CASCADE"), index=True)
    time_ms: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class WinnerRow(_Winner, Base):
    """The fastest servable record of each key under the default policy (validated, pending or
    verified); replaced only by a strictly faster one, or when its record stops being served."""

    __tablename__ = "winners"


class VerifiedWinnerRow(_Winner, Base):
    """The fastest verified record of each key: what the ``verified`` policy serves."""

    __tablename__ = "verified_winners"


class DisputeRow(Base):
    """A consumer's report that a record's config failed its check where it was used."""

    __tablename__ = "disputes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    record_id: Mapped[int] = mapped_column(ForeignKey("records.id", ondelete="CASCADE"), index=True)
    reporter: Mapped[str] = mapped_column(String(128))  # the token name
    problem: Mapped[dict[str, Any]]
    check: Mapped[dict[str, Any]]
    device: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    note: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class JobRow(Base):
    """A tuning job: one per key; ``queued`` → ``running`` (leased) → ``done`` | ``failed``."""

    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    key: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(String(16), default="queued")
    priority: Mapped[int] = mapped_column(Integer, default=0)
    source: Mapped[str] = mapped_column(String(32), default="api")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    lease_owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    # The token that claimed the lease (its id): only it (or an admin token) may renew or end it.
    lease_token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Its name: the worker's name above is the claimant's own word, the token's is the server's.
    lease_token_name: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    error: Mapped[str] = mapped_column(Text, default="")
    # The token whose worker reported ``error`` (its words); "": the server's own (a lease run
    # out, a verifier's rejection); NULL: none, or not recorded (an error stored before 0017).
    error_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    record_id: Mapped[int | None] = mapped_column(ForeignKey("records.id"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # Who asked for it by a miss (``token:<id>`` or ``addr:<address>``): each caller's share of
    # the jobs misses may create is counted by it. NULL: not from a miss.
    requested_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # What can run the job (from its key): a claim names its arch and backends.
    backend: Mapped[str | None] = mapped_column(String(16), nullable=True)
    device_arch: Mapped[str | None] = mapped_column(String(128), nullable=True)
    # The module of a user's kernel (``package.module:Class``); NULL: a built-in kernel.
    kernel_module: Mapped[str | None] = mapped_column(String(128), nullable=True)
    # The key's kernel and its version, as columns a claim filters on: a worker running another
    # version of the kernel is not handed the job (NULL: stored by a server from before 0023
    # while another was upgraded, handed to any claim as then).
    kernel: Mapped[str | None] = mapped_column(String(128), nullable=True)
    source_hash: Mapped[str | None] = mapped_column(String(128), nullable=True)
    # How to tune it; unset: the worker's own choice.
    strategy: Mapped[str | None] = mapped_column(String(64), nullable=True)
    trials: Mapped[int | None] = mapped_column(Integer, nullable=True)

    __table_args__ = (
        Index("ix_jobs_claimable", "state", "priority", "id"),
        Index("ix_jobs_target", "device_arch", "backend"),
        Index("ix_jobs_requested_by", "requested_by", "created_at"),
        # The jobs a key's records answered, opened again when the key is served by none.
        Index("ix_jobs_answered", "record_id", "state"),
    )


class TokenRow(Base):
    """An API token: its SHA-256 and its first characters, never the token itself."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128))
    scope: Mapped[str] = mapped_column(String(16))
    prefix: Mapped[str] = mapped_column(String(16))
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # When its records were withdrawn (revoked as leaked: cache_server.withdrawal); a twin on
    # its word is then never served again by another's pass (cache_server.twins.settle).
    withdrawn_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Its uploads are served as verified at once (the verified policy), without a verifier.
    trusted: Mapped[bool] = mapped_column(Boolean, default=False)


class TokenUsageRow(Base):
    """The bytes of records and artifacts a token has stored, against the server's quota
    (:mod:`cache_server.quota`); no row: none."""

    __tablename__ = "token_usage"

    # No foreign key: its check would lock the token's row, which a revocation holds.
    token_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0)


class ArtifactRow(Base):
    """A token's copy of a backend's own JSON (Inductor choices, MetaSchedule records):
    :mod:`tunecache.artifacts`, :mod:`cache_server.artifacts`.

    ``digest`` (SHA-256 of namespace, partition, key, item and token id) is the one unique name
    an upsert conflicts on; ``item_digest`` (the same without the token) names the item's copies
    together; reads go by ``(namespace, partition, key)`` or by ``id`` within a partition.
    """

    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    item_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    namespace: Mapped[str] = mapped_column(String(32))
    partition: Mapped[str] = mapped_column(String(256))
    key: Mapped[str] = mapped_column(String(256))
    item: Mapped[str] = mapped_column(String(128), default="")
    value: Mapped[Any] = mapped_column(JSON)
    score: Mapped[float | None] = mapped_column(Float, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    uploaded_by: Mapped[str | None] = mapped_column(String(128), nullable=True)  # token name
    # The token whose copy this is (None: stored behind the API, or before copies were per token
    # by a token whose name was not unique); a revoked token's copies are not served.
    token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    trusted: Mapped[bool] = mapped_column(Boolean, default=False)  # uploaded by a trusted token

    __table_args__ = (
        Index("ix_artifacts_name", "namespace", "partition", "key"),
        # An item's copies, found at once (which copy is served is asked per row read).
        Index("ix_artifacts_item", "item_digest"),
        # A partition's page read in id order, from where the last one ended, without sorting.
        Index("ix_artifacts_order", "namespace", "partition", "id"),
    )
