"""Wire schemas shared by the client, the tuner and the cache server: keys, records, lookups.

The job queue's are in :mod:`tunecache.jobs`, disputes' and verifiers' in
:mod:`tunecache.verification`, snapshots' in :mod:`tunecache.snapshot`, artifacts' in
:mod:`tunecache.artifacts`, measurements' (timings, their conditions, speedups) in
:mod:`tunecache.measured`, a key's (re-exported here) in :mod:`tunecache.key_model`; their strict
base is :mod:`tunecache.strict`.

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
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    StrictBool,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tunecache import believed, examples
from tunecache.canonical import check_json_size
from tunecache.configcheck import config_problem
from tunecache.jsonsafe import INT64_MAX
from tunecache.kernels import builtin_problem
from tunecache.key_model import Backend as Backend
from tunecache.key_model import DeviceModel as DeviceModel
from tunecache.key_model import Dtype as Dtype
from tunecache.key_model import KeyModel as KeyModel
from tunecache.key_model import Name as Name
from tunecache.key_model import Problem as Problem
from tunecache.key_model import ProblemName, checked_problem
from tunecache.measured import MAX_NOISE_REASONS as MAX_NOISE_REASONS
from tunecache.measured import ROUNDING, uploaded
from tunecache.measured import SAME_BELOW as SAME_BELOW
from tunecache.measured import BaselineModel as BaselineModel
from tunecache.measured import ConditionsModel as ConditionsModel
from tunecache.measured import Speedup as Speedup
from tunecache.measured import TimingModel as TimingModel
from tunecache.problem import MAX_PARAMS, foreign_params
from tunecache.strict import INTEGRAL as INTEGRAL
from tunecache.strict import SERVED, UNSIGNED, Utc
from tunecache.strict import STORED as STORED
from tunecache.strict import Line as Line
from tunecache.strict import Millis as Millis
from tunecache.strict import Strict as _Strict
from tunecache.strict import Text as Text

MAX_TRIALS = 20_000
# Bytes of a record's trials (their JSON) the tuner sends: half the server's default body limit
# (16 MiB), the rest left to the record's other parts. MetaSchedule's traces are kilobytes each.
MAX_TRIALS_BYTES = 8 * 1024 * 1024
MAX_LISTED = 100_000  # records one listing holds at most (a server's list_limit)
MAX_CHECKS = 256
MAX_CONFIG_BYTES = 256 * 1024
MAX_ID = 2**31 - 1  # ids are INTEGER columns: int32 on PostgreSQL
MAX_SEARCH_SECONDS = 1e8
MAX_REPEATS = 64  # the times a trial keeps behind its time
MAX_TRIAL_ERROR = 2048  # characters of a trial's error

ShortText = Annotated[Text, Field(max_length=512)]
# A relative or absolute error: any size a broken kernel produces, but a number.
Error = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False), UNSIGNED]
# A relative-error bound: 1.0 (100 %) already lets anything of the right magnitude through.
Tolerance = Annotated[float, Field(strict=True, gt=0, le=1.0, allow_inf_nan=False)]
RecordId = Annotated[int, Field(strict=True, ge=1, le=MAX_ID), INTEGRAL]
MAX_LEASE_SECONDS = 86_400  # a day
LeaseSeconds = Annotated[float, Field(strict=True, gt=0, le=MAX_LEASE_SECONDS, allow_inf_nan=False)]
JSONObject = dict[str, Any]


def _check_config(value: JSONObject) -> JSONObject:
    checked: JSONObject = check_json_size(value, "config", MAX_CONFIG_BYTES)
    return checked


class CheckModel(_Strict):
    """One comparison of a candidate's output with the float64 golden reference."""

    problem: Problem
    seed: Annotated[int, Field(strict=True, ge=0, le=INT64_MAX), INTEGRAL]
    # ‖out − ref‖ / ‖ref‖; None when the output could not be compared (NaN, crash, wrong shape).
    rel_error: Error | None
    max_abs_error: Error | None
    tolerance: Tolerance
    passed: StrictBool
    note: ShortText = ""

    _valid_problem = field_validator("problem", mode="before")(checked_problem)

    @classmethod
    def raised(cls, problem: Mapping[str, Any], seed: int, why: str) -> CheckModel:
        """A failed check whose run raised, so nothing could be compared; ``why`` says what
        raised (cut to the note's length)."""
        return cls(problem=dict(problem), seed=seed, rel_error=None, max_abs_error=None,
                   tolerance=1.0, passed=False, note=why[:512])  # fmt: skip

    def failure(self) -> str:
        """What failed, in words: its note, else its error against its tolerance."""
        if self.note or self.rel_error is None:
            return self.note or "failed"
        return f"relative error {self.rel_error:.3g} > tolerance {self.tolerance:g}"


class ValidationReport(_Strict):
    """How a winner was checked against the golden reference."""

    passed: StrictBool
    tolerance: Tolerance
    max_rel_error: Error | None
    checks: Annotated[list[CheckModel], Field(min_length=1, max_length=MAX_CHECKS)]
    reference: Annotated[Line, Field(max_length=128)] = "float64"

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> ValidationReport:
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
        if uploaded(info) and (why := self.contradiction()):
            raise ValueError(why)
        return self

    def contradiction(self) -> str | None:
        """Why its figures say it failed though it says it passed (``None``: they agree). Every
        check passes exactly when its error is within its tolerance (the tuner's, the Triton
        drop-in's, a verifier's: a merged report's tolerance is its loosest check's); an audit
        uploaded a check passed at 0.5 against 0.01, served and shown as validated."""
        if not self.passed:
            return None
        for i, c in enumerate(self.checks):
            if c.rel_error is None:
                return f"validation.checks[{i}] passed with no relative error compared"
            if c.rel_error > c.tolerance * (1 + ROUNDING):
                return (f"validation.checks[{i}] passed with relative error {c.rel_error:g} "
                        f"over its tolerance {c.tolerance:g}")  # fmt: skip
        if (self.max_rel_error or 0.0) > self.tolerance * (1 + ROUNDING):
            return (f"validation passed with max_rel_error {self.max_rel_error:g} over its "
                    f"tolerance {self.tolerance:g}")  # fmt: skip
        return None


TrialStatus = Literal["ok", "invalid", "compile_error", "runtime_error", "timeout", "wrong_answer"]


class Trial(_Strict):
    """One evaluated candidate: from the search (every strategy, every backend's own search, the
    harness) to the record on the wire. ``time_ms`` is set exactly when ``status`` is ``ok``;
    ``times_ms`` is the spread behind it where the measurer keeps it (not stored by the server)."""

    config: JSONObject
    status: TrialStatus
    time_ms: Millis | None = None
    error: Annotated[Text, Field(max_length=MAX_TRIAL_ERROR)] = ""
    times_ms: Annotated[tuple[Millis, ...], Field(max_length=MAX_REPEATS)] = ()

    _config_size = field_validator("config")(_check_config)

    @model_validator(mode="after")
    def _time_iff_ok(self) -> Trial:
        if (self.status == "ok") != (self.time_ms is not None):
            raise ValueError("a trial has time_ms exactly when its status is 'ok'")
        return self


class SearchModel(_Strict):
    """How the winner was found."""

    strategy: Annotated[Line, Field(max_length=64)]
    trials: Annotated[int, Field(strict=True, ge=0, le=10_000_000), INTEGRAL]
    # The tune's (the tuner's: search, re-timing, validation, baselines; Triton's: its bench).
    seconds: Annotated[
        float, Field(strict=True, ge=0, le=MAX_SEARCH_SECONDS, allow_inf_nan=False), UNSIGNED
    ]


class Provenance(_Strict):
    machine: Annotated[Line, Field(max_length=255)] = ""
    tool_version: Annotated[Line, Field(max_length=64)] = ""
    device_raw_name: Annotated[Line, Field(max_length=255)] = ""


def _closed_config(value: JSONObject, info: ValidationInfo) -> JSONObject:
    """The config if its backend's closed schema admits it (:mod:`tunecache.configcheck`)."""
    key = info.data.get("key")
    if isinstance(key, KeyModel) and (why := config_problem(
        key.backend, value, kernel=key.kernel, device=key.device.kind
    )):  # fmt: skip
        raise ValueError(f"not a {key.backend} config that may be served: {why}")
    return value


def builtin_key(value: Any, info: ValidationInfo) -> Any:
    """The key if a built-in kernel's problem is its shape parameters (workers run it as that);
    one stored or served is read as it is (a record stored before the check)."""
    if info.context is not STORED and info.context is not SERVED and \
            (why := builtin_problem(value.kernel, value.problem)):  # fmt: skip
        raise ValueError(f"key: {why}")
    return value


def _as_stored(value: Any, info: ValidationInfo) -> Any:
    return value


class RecordCreate(_Strict):
    """A tuning result as uploaded by a tuner.

    Its ``config`` must pass its backend's closed schema (:mod:`tunecache.configcheck`): a
    record is data, never code. Records read back from a server (:class:`RecordPublic`) are
    parsed as they were stored; the client checks what it will use (:mod:`tunecache.resolver`).
    """

    key: KeyModel
    config: JSONObject
    config_summary: Annotated[Line, Field(max_length=256)] = ""
    timing: TimingModel
    baselines: Annotated[list[BaselineModel], Field(max_length=16)] = []
    validation: ValidationReport
    search: SearchModel
    trials: Annotated[list[Trial], Field(max_length=MAX_TRIALS)] = []
    provenance: Provenance = Provenance()

    model_config = ConfigDict(json_schema_extra={"examples": [examples.RECORD]})
    _builtin_key = field_validator("key")(builtin_key)
    _config_size = field_validator("config")(_check_config)
    _config_closed = field_validator("config")(_closed_config)
    _one_of_each = field_validator("baselines")(believed.one_of_each)
    _speedups_agree = field_validator("baselines")(BaselineModel.agreeing)  # with the timings

    @model_validator(mode="after")
    def _checks_of_the_key(self, info: ValidationInfo) -> RecordCreate:
        """A check ran the key's kernel, at the key's parameters (1.75 MB records of made-up
        ones slowed every listing); a record stored or served is read as it is."""
        if info.context is not STORED and info.context is not SERVED and (why := foreign_params(
                self.key.problem, [c.problem for c in self.validation.checks])):  # fmt: skip
            raise ValueError(why)
        return self

    @model_validator(mode="after")
    def _search_agrees(self, info: ValidationInfo) -> RecordCreate:
        """What its search could not have done, as uploaded: interleaved rounds longer than the
        whole tune (an audit uploaded 10,000 rounds of 1 ms
        or more in a tune of 0.001 s). The rounds ran inside ``search.seconds`` (tuner.tune
        times the final comparison too), each contender at least one call a round, half of them
        no quicker than its median round's quickest (the timing kept)."""
        if not uploaded(info):
            return self
        compared = [b for b in self.baselines if b.speedup is not None]
        rounds = max((b.speedup.rounds for b in compared if b.speedup), default=0)
        least_ms = (rounds + 1) // 2 * (self.timing.min_ms + sum(b.timing.min_ms for b in compared))
        if least_ms > (self.search.seconds + 0.001) * 1000 * (1 + ROUNDING):
            raise ValueError(f"{rounds} interleaved rounds take at least {least_ms / 1000:.3g} s, "
                             f"more than search.seconds {self.search.seconds:g}")  # fmt: skip
        return self

    def comparisons(self) -> list[BaselineModel]:
        """The baselines its speedups are read from: all it holds, less any named twice (a stored
        record's: not when a verifier did not believe its uploader's times)."""
        return believed.named_once(self.baselines)

    def timed(self) -> tuple[str, TimingModel]:
        """Who measured the time shown and ranked, and that timing: the uploader's (``winner``)."""
        return "winner", self.timing

    def speedup(self, baseline: str = "torch_eager") -> float | None:
        """How many times faster than ``baseline`` the winner ran: the interleaved comparison's
        median where the record has one, else baseline median / winner median; ``None`` without
        that baseline, or none believed (:meth:`comparisons`)."""
        return believed.speedup(self.comparisons(), self.timing, baseline)

    @property
    def slower_than_eager(self) -> bool:
        """Whether torch eager ran measurably faster than the winner: the whole interval of the
        interleaved comparison below 1 (records without one: a ratio that reads as slower,
        below :data:`SAME_BELOW`)."""
        return believed.slower_than_eager(self.comparisons(), self.timing)

    @property
    def noisy(self) -> bool:
        """Whether the timing shown or a baseline's was noisy: said so, or its figures say so
        (:meth:`noise`)."""
        return bool(self.noise())

    @property
    def time_noisy(self) -> bool:
        """Whether the time shown (:meth:`timed`) was noisy, not only a baseline's: a badge
        beside the time says which."""
        return bool(believed.noise_reasons([self.timed()], self.key.device.kind != "cpu"))

    @property
    def noise_label(self) -> str:
        """``noisy`` where the time shown was, ``noisy baseline`` where only a baseline's was,
        else ``""``: the words beside its time in ``records ls``, ``best`` and the dashboard."""
        return "noisy" if self.time_noisy else "noisy baseline" if self.noisy else ""

    def noise(self) -> list[str]:
        """Why the timings shown are noisy, each reason once: the time shown (:meth:`timed`:
        ``winner:``, or ``verifier:`` once a verifier re-timed it), then the baselines'
        compared with (:meth:`comparisons`, named)."""
        compared = ((b.name, b.timing) for b in self.comparisons())
        return believed.noise_reasons([self.timed(), *compared], self.key.device.kind != "cpu")

    def speedup_interval(self, baseline: str = "torch_eager") -> tuple[float, float] | None:
        """The interval of :meth:`speedup` from the interleaved comparison (``None`` where the
        record has none: tuned before it existed, or timed in a single round)."""
        return believed.interval(self.comparisons(), baseline)


# pending: validated by its uploader, served under the default policy; verified: re-validated by a
# verifier (or uploaded with a trusted token); disputed: a consumer's check failed, served under no
# policy until a verifier re-verifies it; rejected: a verifier's check failed, never served.
RecordStatus = Literal["pending", "verified", "disputed", "rejected"]


class VerificationPublic(_Strict):
    """How a verifier re-checked a record on its own device of the record's arch."""

    passed: bool
    verifier: str  # the token name of the verifier
    device_name: str
    verified_at: Utc
    timing: TimingModel | None = None  # the verifier's own timing of the config
    validation: ValidationReport | None = None  # the verifier's checks
    error: str = ""
    # verifier / uploader median; timing_flag: the uploader's >20 % faster (TIMING_FLAG_RATIO)
    time_ratio: float | None = None
    timing_flag: bool = False


class RecordPublic(RecordCreate):
    """A stored record as the server returns it.

    ``status`` says whether it may be served (``pending`` and ``verified`` under the default
    policy, ``verified`` only under the ``verified`` policy); ``uploaded_by`` is the name of the
    token that uploaded it, as the server saw it.
    """

    id: int
    key_hash: str
    created_at: Utc
    is_winner: bool = False
    status: RecordStatus = "pending"
    uploaded_by: str | None = None
    verification: VerificationPublic | None = None
    disputes: int = 0

    _config_closed = field_validator("config")(_as_stored)  # read back as stored: the client
    _builtin_key = field_validator("key")(_as_stored)  # checks what it uses

    @property
    def believed_timing(self) -> TimingModel:
        """The verifier's timing once a verifier passed the record, else the uploader's: the
        time the server ranks it by."""
        return self.timed()[1]

    @property
    def timed_on(self) -> str:
        """The name of the device that measured :attr:`believed_timing`: the verifier's, else the
        uploader's (the key's device)."""
        check = self._timed_by_verifier()
        return self.key.device.name if check is None else check.device_name

    def timed(self) -> tuple[str, TimingModel]:
        """``("verifier", its timing)`` once a verifier re-timed it, else the uploader's."""
        check = self._timed_by_verifier()
        if check is None or check.timing is None:
            return "winner", self.timing
        return "verifier", check.timing

    def comparisons(self) -> list[BaselineModel]:
        """None once a verifier flagged the uploaded time as too fast (``timing_flag``), or timed
        it on the uploader's very device and the two differ past
        :data:`tunecache.believed.APART_RATIO` either way: the baselines were timed beside the
        uploader's time, and its "20x faster than torch eager" would stand beside a time it did
        not match. A verifier on another device of the arch (an H100 SXM after a PCIe) may time
        it faster and leave the uploader's own comparisons standing, marked as the uploader's."""
        who, shown = self.timed()
        flagged = self.verification is not None and self.verification.timing_flag
        apart = self.timed_on == self.key.device.name and believed.disagree(shown, self.timing)
        if who == "verifier" and (flagged or apart):
            return []
        return super().comparisons()

    def _timed_by_verifier(self) -> VerificationPublic | None:
        check = self.verification
        if self.status == "verified" and check is not None and check.timing is not None:
            return check
        return None


class UploadResult(_Strict):
    """Where an upload stands: its id, the key's winner (default policy), the record's status and
    the server's serving policy (under ``verified`` a pending record is not served yet)."""

    record_id: int
    key_hash: str
    winner_record_id: int | None
    is_winner: bool
    status: RecordStatus = "pending"
    policy: Literal["validated", "verified"] = "validated"


class LookupRequest(_Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.LOOKUP]})

    key: KeyModel
    # Which environment versions may be served: strict (equal), compatible (same major.minor), any
    policy: Literal["strict", "compatible", "any"] = "strict"
    # The problem's dimensions the caller's kernel rounds to a power of two (its bucket); absent:
    # the server's registration of the kernel (a user's kernel: none). See tunecache.policies.
    bucket: Annotated[list[ProblemName], Field(max_length=MAX_PARAMS)] | None = None

    @model_validator(mode="after")
    def _bucket_of_the_problem(self) -> LookupRequest:
        if stray := sorted(set(self.bucket or ()) - set(self.key.problem)):
            raise ValueError(f"bucket names {stray}, not parameters of the key's problem")
        return self


class LookupResponse(_Strict):
    record: RecordPublic
    # The rule that matched: the key itself, the same problem on another device of the arch,
    # or the nearest shape in the key's bucket (tunecache.policies).
    match: Literal["exact", "same_arch", "bucket"] = "exact"
    policy: Literal["strict", "compatible", "any"] = "strict"


class RecordList(_Strict):
    # A server lists at most its list_limit (at most this); a hostile one's million numbers
    # were a million errors to build, 11 s and 1.7 GB of a 2 MiB answer.
    items: Annotated[list[RecordPublic], Field(max_length=MAX_LISTED)]
    count: int


class Health(_Strict):
    status: Literal["ok"] = "ok"
    database: str
    records: int
    version: str
