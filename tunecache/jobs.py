"""Wire schemas of the tuning-job queue: a job, its claim with a lease, its outcome.

The queue itself is :mod:`cache_server.jobs` (server) and :mod:`tuner.daemon` (workers).
"""

from __future__ import annotations

from typing import Annotated, Literal, Protocol

from pydantic import ConfigDict, Field, field_validator

from tunecache import examples
from tunecache.key_model import Name, SourceHash
from tunecache.schemas import (
    INTEGRAL,
    Backend,
    KeyModel,
    LeaseSeconds,
    Line,
    RecordId,
    Text,
    _Strict,
    builtin_key,
)
from tunecache.strict import Utc

JobState = Literal["queued", "running", "done", "failed"]


Package = Annotated[
    str,
    Field(
        min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
    ),
]
STRATEGY_PATTERN = r"^[a-z_]{1,64}$"
MAX_JOB_TRIALS = 1_000_000
MAX_JOB_PAGE = 1000  # jobs one listing holds at most
JobStrategy = Annotated[str, Field(min_length=1, max_length=64, pattern=STRATEGY_PATTERN)]
JobTrials = Annotated[int, Field(strict=True, ge=1, le=MAX_JOB_TRIALS), INTEGRAL]
KeyHash = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
MAX_CLAIM_KEYS = 4096  # a claim's key filter: 270 KB of hashes at most
# Key hashes one listing of jobs asks for (``GET /v1/jobs?key_hash=…``, a 3.7 KB query): a
# manifest's jobs are read in such chunks, not as the whole queue anyone may grow.
MAX_LISTED_KEYS = 50
ClaimKeys = Annotated[list[KeyHash], Field(min_length=1, max_length=MAX_CLAIM_KEYS)]
# Kernels a claim names the version of (a daemon: 15 built-ins on three backends, then the
# users' kernels it imported): 79 KiB at most.
MAX_CLAIM_SOURCES = 256


MISS_SOURCE = "miss"
OPEN_STATES = ("queued", "running")  # a job not ended: claimable, or worked on
CANCELLED = "cancelled by "  # a cancelled job's error: this, then the name of its canceller


class _Ended(Protocol):
    @property
    def state(self) -> str: ...
    @property
    def error(self) -> str: ...
    @property
    def error_by(self) -> str | None: ...


def cancelled(job: _Ended) -> bool:
    """Whether ``job`` (as stored, or as answered) ended cancelled: its error the server's own
    words (``error_by`` ``""``) saying so; a worker's report may say anything."""
    return job.state == "failed" and job.error_by == "" and job.error.startswith(CANCELLED)


def _not_a_miss_source(value: str) -> str:
    """``value``, a job's source, if it is not :data:`MISS_SOURCE`: the server's, for the jobs
    misses open. A write token's jobs of that source were counted in the misses' server-wide
    budget, which one token then spent alone (every other caller's misses refused a minute),
    and a miss's answer marked them done."""
    if value == MISS_SOURCE:
        raise ValueError(f"source {MISS_SOURCE!r} is the server's: a miss is reported at "
                         "POST /v1/misses, which bounds each caller's share")  # fmt: skip
    return value


class JobCreate(_Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.JOB]})

    key: KeyModel
    priority: Annotated[int, Field(strict=True, ge=-1000, le=1000), INTEGRAL] = 0
    max_attempts: Annotated[int, Field(strict=True, ge=1, le=100), INTEGRAL] = 3
    source: Annotated[str, Field(max_length=32, pattern=r"^[a-z_]+$")] = "api"  # never MISS_SOURCE
    # How to tune it (a strategy name, a budget in trials); unset: the worker's own.
    strategy: JobStrategy | None = None
    trials: JobTrials | None = None

    _builtin_key = field_validator("key")(builtin_key)
    _not_a_miss = field_validator("source")(_not_a_miss_source)


class JobPublic(_Strict):
    id: int
    key_hash: str
    key: KeyModel
    state: JobState
    priority: int
    source: str
    attempts: int
    max_attempts: int
    lease_owner: str | None
    lease_expires_at: Utc | None
    error: str
    record_id: int | None
    created_at: Utc
    updated_at: Utc
    strategy: JobStrategy | None = None  # what a job may be queued with (a worker runs it)
    trials: JobTrials | None = None
    # Whose words ``error`` is: a token's name (a worker's report, anything a write token
    # wrote); "": the server's own (a lease run out, a verifier's finding, a withdrawal); None:
    # not recorded (an error stored before migration 0017, or a server that does not say).
    error_by: Annotated[str, Field(max_length=128)] | None = None


class JobEnqueued(_Strict):
    job: JobPublic
    created: bool  # False: a job for this key already existed (deduplicated)


class KernelSource(_Strict):
    """The version of a kernel a worker runs on a backend: a job of that kernel and backend
    with another source hash is not handed to it (it would fail the job, an attempt spent)."""

    kernel: Name
    backend: Backend
    source_hash: SourceHash


class ClaimRequest(_Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.CLAIM]})

    worker: Annotated[Line, Field(min_length=1, max_length=128)]
    lease_seconds: LeaseSeconds = 300.0
    # What the worker can run; unset: anything.
    device_arch: Annotated[Line, Field(min_length=1, max_length=128)] | None = None
    backends: Annotated[list[Backend], Field(min_length=1, max_length=3)] | None = None
    # The packages of users' kernels it may import ([]: built-in kernels only).
    kernel_packages: Annotated[list[Package], Field(max_length=64)] | None = None
    # Only jobs for these keys (``pretune --local``: its manifest's; unset: any).
    key_hashes: ClaimKeys | None = None
    # The kernels whose version it knows (unset or unlisted: any version).
    sources: Annotated[list[KernelSource], Field(max_length=MAX_CLAIM_SOURCES)] | None = None


class LeaseRequest(_Strict):
    worker: Annotated[Line, Field(min_length=1, max_length=128)]
    lease_seconds: LeaseSeconds = 300.0


class LeaseRelease(_Strict):
    """A lease given back (a job's, a record's verification), its attempt unfinished: the
    worker that holds it."""

    worker: Annotated[Line, Field(min_length=1, max_length=128)]


class JobResult(_Strict):
    """A failed attempt: the worker, and why (``record_id`` is read by no route; kept so that
    old workers' bodies stay valid)."""

    worker: Annotated[Line, Field(min_length=1, max_length=128)]
    record_id: RecordId | None = None
    error: Annotated[Text, Field(max_length=4096)] = ""


class JobDone(_Strict):
    """A job answered: the record that answers it. A job done with no record had its key
    reported tuned with nothing served, past every check (a verifier's rejection reopens a job
    by its record): one that could not be answered is failed."""

    worker: Annotated[Line, Field(min_length=1, max_length=128)]
    record_id: RecordId


class JobList(_Strict):
    items: Annotated[list[JobPublic], Field(max_length=MAX_JOB_PAGE)]
    count: int
