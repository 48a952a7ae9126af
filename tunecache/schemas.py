"""Wire schemas shared by the client, the tuner and the cache server.

Naming follows the FastAPI template: ``XCreate`` is what a client sends, ``XPublic`` what the server
returns. Every model forbids unknown fields and bounds its sizes, so a malformed or oversized upload
is a 4xx with a reason, never a 5xx:

- anywhere in a body (:func:`tunecache.jsonsafe.json_problem`): no NUL character or lone
  surrogate in a string, no NaN or infinity, no integer outside int64, no deep nesting;
- every number has bounds, and is strict: ``true`` is not a count, ``1.5`` not a size; an integer
  that lands in an ``INTEGER`` column (an id) fits PostgreSQL's int32.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tunecache import examples
from tunecache.canonical import canonical_json
from tunecache.errors import InvalidInput
from tunecache.jsonsafe import INT64_MAX, json_problem
from tunecache.key import (
    BACKENDS,
    DTYPES,
    KEY_SCHEMA_VERSION,
    MAX_DIM,
    MAX_FLAG_CHARS,
    MAX_PARAMS,
    Key,
    check_problem,
    describe,
)

MAX_TRIALS = 20_000
MAX_CHECKS = 256
MAX_CONFIG_BYTES = 256 * 1024
MAX_ID = 2**31 - 1  # ids are INTEGER columns: int32 on PostgreSQL
MAX_SEARCH_SECONDS = 1e8

Backend = Literal["triton", "tvm", "inductor"]
assert set(BACKENDS) == {"triton", "tvm", "inductor"}
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_.:-]*$")]
ShortText = Annotated[str, Field(max_length=512)]
Millis = Annotated[float, Field(strict=True, gt=0, lt=1e9, allow_inf_nan=False)]
# A relative or absolute error: any size a broken kernel produces, but a number.
Error = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
# A relative-error bound: 1.0 (100 %) already lets anything of the right magnitude through.
Tolerance = Annotated[float, Field(strict=True, gt=0, le=1.0, allow_inf_nan=False)]
RecordId = Annotated[int, Field(strict=True, ge=1, le=MAX_ID)]
LeaseSeconds = Annotated[float, Field(strict=True, gt=0, le=86_400, allow_inf_nan=False)]
JSONObject = dict[str, Any]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _sane_json(cls, data: Any) -> Any:
        if (why := json_problem(data, cls.__name__)) is not None:
            raise ValueError(why)
        return data


def check_json_size(value: Any, what: str = "config", limit: int = MAX_CONFIG_BYTES) -> Any:
    """``value`` if its canonical JSON is at most ``limit`` bytes (a validator's ValueError if
    not, or if it is not plain JSON data)."""
    try:
        size = len(canonical_json(value).encode())
    except InvalidInput as exc:
        raise ValueError(str(exc)) from None
    if size > limit:
        raise ValueError(f"{what} is {size} bytes; the limit is {limit}")
    return value


def _check_config(value: JSONObject) -> JSONObject:
    checked: JSONObject = check_json_size(value)
    return checked


# The constraints of ``tunecache.key.check_problem`` that JSON Schema can say (the document a
# client is generated from); it also checks that one size is an integer, and the kernel's rules.
ProblemName = Annotated[str, Field(min_length=1, max_length=128,
                                   pattern=r"^[A-Za-z_][A-Za-z0-9_.:-]*$")]  # fmt: skip
ProblemValue = (
    Annotated[int, Field(strict=True, ge=1, le=MAX_DIM)]
    | StrictBool
    | Annotated[StrictStr, Field(max_length=MAX_FLAG_CHARS)]
)
Problem = Annotated[
    dict[ProblemName, ProblemValue],
    Field(min_length=1, max_length=MAX_PARAMS, json_schema_extra={"additionalProperties": False}),
]
# A string (a list is "not a valid string"), one of DTYPES (checked by KeyModel, naming them).
Dtype = Annotated[str, Field(json_schema_extra={"enum": list(DTYPES)})]


class DeviceModel(_Strict):
    kind: Literal["cpu", "cuda", "rocm"]
    arch: Name
    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$")]
    units: Annotated[int, Field(strict=True, ge=1, le=1_000_000)]
    memory_gb: Annotated[int, Field(strict=True, ge=0, le=1_000_000)] = 0
    flags: Annotated[list[Name], Field(max_length=64)] = []


def _checked_problem(value: Any, kernel: str | None = None) -> Any:
    """``check_problem`` as a pydantic validator: one error naming the parameter and its bound."""
    try:
        return check_problem(value, kernel=kernel)
    except InvalidInput as exc:
        raise ValueError(str(exc)) from None


class KeyModel(_Strict):
    """A :class:`tunecache.key.Key` on the wire."""

    schema_: Annotated[int, Field(alias="schema")] = KEY_SCHEMA_VERSION
    kernel: Name
    source_hash: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[0-9a-f]+$")]
    backend: Backend
    problem: Problem
    dtype: Dtype
    device: DeviceModel
    # Distribution name -> version (tunecache.environment).
    environment: Annotated[
        dict[
            Annotated[
                str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
            ],
            Annotated[str, Field(max_length=64, pattern=r"^[^\x00-\x1f\x7f]*$")],
        ],
        Field(max_length=16),
    ]

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True,
                              json_schema_extra={"examples": [examples.KEY]})  # fmt: skip

    @field_validator("schema_", mode="before")
    @classmethod
    def _known_schema(cls, value: Any) -> Any:
        if type(value) is not int or value != KEY_SCHEMA_VERSION:  # not True, not 1.0
            raise ValueError(f"key schema {describe(value)} is not {KEY_SCHEMA_VERSION}")
        return value

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value not in DTYPES:
            raise ValueError(f"unknown dtype {describe(value)}; expected one of {DTYPES}")
        return value

    @field_validator("problem", mode="before")
    @classmethod
    def _valid_problem(cls, value: Any, info: ValidationInfo) -> Any:
        return _checked_problem(value, info.data.get("kernel"))

    @classmethod
    def from_key(cls, key: Key) -> KeyModel:
        return cls.model_validate(key.to_json())

    def to_key(self) -> Key:
        return Key.from_json(self.model_dump(by_alias=True))

    def digest(self) -> str:
        return self.to_key().digest()


class TimingModel(_Strict):
    """A timing: median of ``repeats`` runs after ``warmup`` runs, with its spread."""

    median_ms: Millis
    min_ms: Millis
    max_ms: Millis
    iqr_ms: Annotated[float, Field(strict=True, ge=0, lt=1e9, allow_inf_nan=False)] = 0.0
    # Up to max_repeats samples of up to 1e6 batched calls each (tunecache.timing).
    repeats: Annotated[int, Field(strict=True, ge=1, le=1_000_000_000)]
    warmup: Annotated[int, Field(strict=True, ge=0, le=1_000_000)] = 0
    timer: Annotated[str, Field(max_length=64)] = "perf_counter"

    @model_validator(mode="after")
    def _ordered(self) -> TimingModel:
        if not self.min_ms <= self.median_ms <= self.max_ms:
            raise ValueError("timing must satisfy min_ms <= median_ms <= max_ms")
        return self


class CheckModel(_Strict):
    """One comparison of a candidate's output with the float64 golden reference."""

    problem: Problem
    seed: Annotated[int, Field(strict=True, ge=0, le=INT64_MAX)]
    # ‖out − ref‖ / ‖ref‖; None when the output could not be compared (NaN, crash, wrong shape).
    rel_error: Error | None
    max_abs_error: Error | None
    tolerance: Tolerance
    passed: StrictBool
    note: ShortText = ""

    _valid_problem = field_validator("problem", mode="before")(_checked_problem)


class ValidationReport(_Strict):
    """How a winner was checked against the golden reference."""

    passed: StrictBool
    tolerance: Tolerance
    max_rel_error: Error | None
    checks: Annotated[list[CheckModel], Field(min_length=1, max_length=MAX_CHECKS)]
    reference: Annotated[str, Field(max_length=128)] = "float64"

    @model_validator(mode="after")
    def _consistent(self) -> ValidationReport:
        if self.passed and not all(c.passed for c in self.checks):
            raise ValueError("validation.passed is true but a check failed")
        errors = [c.rel_error for c in self.checks]
        worst = None if None in errors else max(e for e in errors if e is not None)
        if (worst is None) != (self.max_rel_error is None) or (
            worst is not None
            and self.max_rel_error is not None
            and not math.isclose(worst, self.max_rel_error, rel_tol=1e-9, abs_tol=1e-300)
        ):
            raise ValueError("validation.max_rel_error is not the worst check's rel_error")
        return self


TrialStatus = Literal["ok", "invalid", "compile_error", "runtime_error", "timeout", "wrong_answer"]


class Trial(_Strict):
    """One evaluated candidate: from the search (every strategy, every backend's own search, the
    harness) to the record on the wire. ``time_ms`` is set exactly when ``status`` is ``ok``;
    ``times_ms`` is the spread behind it where the measurer keeps it (not stored by the server)."""

    config: JSONObject
    status: TrialStatus
    time_ms: Millis | None = None
    error: Annotated[str, Field(max_length=2048)] = ""
    times_ms: Annotated[tuple[Millis, ...], Field(max_length=64)] = ()

    _config_size = field_validator("config")(_check_config)

    @model_validator(mode="after")
    def _time_iff_ok(self) -> Trial:
        if (self.status == "ok") != (self.time_ms is not None):
            raise ValueError("a trial has time_ms exactly when its status is 'ok'")
        return self


class SearchModel(_Strict):
    """How the winner was found."""

    strategy: Annotated[str, Field(max_length=64)]
    trials: Annotated[int, Field(strict=True, ge=0, le=10_000_000)]
    seconds: Annotated[float, Field(strict=True, ge=0, le=MAX_SEARCH_SECONDS, allow_inf_nan=False)]


class BaselineModel(_Strict):
    name: Annotated[str, Field(max_length=64)]  # "torch_eager", "default_config", "cublas"
    timing: TimingModel


class Provenance(_Strict):
    machine: Annotated[str, Field(max_length=255)] = ""
    tool_version: Annotated[str, Field(max_length=64)] = ""
    device_raw_name: Annotated[str, Field(max_length=255)] = ""


class RecordCreate(_Strict):
    """A tuning result as uploaded by a tuner."""

    key: KeyModel
    config: JSONObject
    config_summary: Annotated[str, Field(max_length=256)] = ""
    timing: TimingModel
    baselines: Annotated[list[BaselineModel], Field(max_length=16)] = []
    validation: ValidationReport
    search: SearchModel
    trials: Annotated[list[Trial], Field(max_length=MAX_TRIALS)] = []
    provenance: Provenance = Provenance()

    model_config = ConfigDict(json_schema_extra={"examples": [examples.RECORD]})
    _config_size = field_validator("config")(_check_config)


class RecordPublic(RecordCreate):
    """A stored record as the server returns it."""

    id: int
    key_hash: str
    created_at: datetime
    is_winner: bool = False

    def speedup(self, baseline: str = "torch_eager") -> float | None:
        """Baseline median / winner median, or ``None`` without that baseline."""
        for b in self.baselines:
            if b.name == baseline:
                return b.timing.median_ms / self.timing.median_ms
        return None


class UploadResult(_Strict):
    record_id: int
    key_hash: str
    winner_record_id: int | None
    is_winner: bool


class LookupRequest(_Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.LOOKUP]})

    key: KeyModel
    # Which environment versions may be served: strict (equal), compatible (same major.minor),
    # any. See tunecache.policies.
    policy: Literal["strict", "compatible", "any"] = "strict"


class LookupResponse(_Strict):
    record: RecordPublic
    # The rule that matched: the key itself, the same problem on another device of the arch,
    # or the nearest shape in the key's bucket (tunecache.policies).
    match: Literal["exact", "same_arch", "bucket"] = "exact"
    policy: Literal["strict", "compatible", "any"] = "strict"


class RecordList(_Strict):
    items: list[RecordPublic]
    count: int


class Health(_Strict):
    status: Literal["ok"] = "ok"
    database: str
    records: int
    version: str


JobState = Literal["queued", "running", "done", "failed"]


JobStrategy = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z_]+$")]
JobTrials = Annotated[int, Field(strict=True, ge=1, le=1_000_000)]


class JobCreate(_Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.JOB]})

    key: KeyModel
    priority: Annotated[int, Field(strict=True, ge=-1000, le=1000)] = 0
    max_attempts: Annotated[int, Field(strict=True, ge=1, le=100)] = 3
    source: Annotated[str, Field(max_length=32, pattern=r"^[a-z_]+$")] = "api"
    # How to tune it (a strategy name, a budget in trials); unset: the worker's own.
    strategy: JobStrategy | None = None
    trials: JobTrials | None = None


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
    lease_expires_at: datetime | None
    error: str
    record_id: int | None
    created_at: datetime
    updated_at: datetime
    strategy: str | None = None
    trials: int | None = None


class JobEnqueued(_Strict):
    job: JobPublic
    created: bool  # False: a job for this key already existed (deduplicated)


class ClaimRequest(_Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.CLAIM]})

    worker: Annotated[str, Field(min_length=1, max_length=128)]
    lease_seconds: LeaseSeconds = 300.0
    # What the worker can run; unset: anything.
    device_arch: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    backends: Annotated[list[Backend], Field(min_length=1, max_length=3)] | None = None


class LeaseRequest(_Strict):
    worker: Annotated[str, Field(min_length=1, max_length=128)]
    lease_seconds: LeaseSeconds = 300.0


class JobResult(_Strict):
    worker: Annotated[str, Field(min_length=1, max_length=128)]
    record_id: RecordId | None = None
    error: Annotated[str, Field(max_length=4096)] = ""


class JobList(_Strict):
    items: list[JobPublic]
    count: int


SNAPSHOT_FORMAT = "tunecache-snapshot/1"
MAX_SNAPSHOT_RECORDS = 50_000


class SnapshotFilters(_Strict):
    """Which winners a snapshot holds: one device arch, optionally narrowed further."""

    device_arch: Name
    device_name: (
        Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$")] | None
    ) = None
    kernel: Name | None = None
    backend: Backend | None = None

    def mismatch(self, key: KeyModel) -> str | None:
        """Why ``key`` falls outside these filters, or ``None`` when it matches them."""
        for name, wanted, actual in (
            ("device_arch", self.device_arch, key.device.arch),
            ("device_name", self.device_name, key.device.name),
            ("kernel", self.kernel, key.kernel),
            ("backend", self.backend, key.backend),
        ):
            if wanted is not None and actual != wanted:
                return f"{name} is {actual!r}, not the snapshot's {wanted!r}"
        return None


class SnapshotPublic(_Strict):
    """The validated winners of one device arch, as one document.

    Only winners are exported, without their trials (``trials`` is empty), to keep snapshots
    small. On import every record, validated or not, must match ``filters``; the count is checked
    before any record is parsed, so an oversized snapshot is refused at once.
    """

    format: Literal["tunecache-snapshot/1"]
    filters: SnapshotFilters
    records: Annotated[list[RecordCreate], Field(max_length=MAX_SNAPSHOT_RECORDS)]

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, data: Any) -> Any:
        if isinstance(data, dict):
            records = data.get("records")
            if isinstance(records, list) and len(records) > MAX_SNAPSHOT_RECORDS:
                raise ValueError(
                    f"a snapshot holds at most {MAX_SNAPSHOT_RECORDS} records, not "
                    f"{len(records)}; split it by kernel or backend"
                )
        return data

    @model_validator(mode="after")
    def _records_match_filters(self) -> SnapshotPublic:
        for i, record in enumerate(self.records):
            if (why := self.filters.mismatch(record.key)) is not None:
                raise ValueError(f"records[{i}]: key {why}")
        return self


class SnapshotImportResult(_Strict):
    imported: int  # records stored, validated or not
    winners_changed: int  # keys whose winner is now a record of this snapshot
