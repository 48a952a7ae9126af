"""Wire schemas of trust: a consumer's dispute of a served record, and a verifier's claims and
findings (:mod:`cache_server.trust` on the server, :mod:`tuner.verify` on a verifier).

A record's own trust fields (``status``, ``uploaded_by``, ``verification``) are on
:class:`tunecache.schemas.RecordPublic`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StrictBool, field_validator, model_validator

from tunecache.schemas import (
    Backend,
    CheckModel,
    DeviceModel,
    LeaseSeconds,
    Line,
    Name,
    Problem,
    RecordPublic,
    RecordStatus,
    ShortText,
    Text,
    TimingModel,
    ValidationReport,
    _Strict,
)
from tunecache.strict import Utc
from tunecache.tokens import name_text

MAX_DISPUTED_PROBLEMS = 64
# With a claim's 204: how many records await another verify token, the claiming token's own
# uploads (a verify token is never handed its own records to check).
OWN_AWAITING_HEADER = "X-Tunecache-Own-Awaiting"


class FailedCheck(CheckModel):
    """A :class:`~tunecache.schemas.CheckModel` that failed (``passed`` is ``false``)."""

    passed: Annotated[StrictBool, Field(json_schema_extra={"const": False})]


class DisputeCreate(_Strict):
    """A consumer's report that a served record's config failed its check where it was used
    (``verify="first"``): the problem it ran at and the comparison that failed."""

    problem: Problem
    check: FailedCheck
    device: DeviceModel | None = None
    note: ShortText = ""

    @field_validator("check", mode="before")
    @classmethod
    def _failed(cls, check: Any) -> Any:
        if isinstance(check, CheckModel):
            check = check.model_dump()
        if isinstance(check, dict) and check.get("passed") is True:
            raise ValueError("a dispute carries the check that failed, not one that passed")
        return check


class DisputeResult(_Strict):
    """The record's status after a dispute (``disputed`` unless a verifier rejected it before)."""

    record_id: int
    status: RecordStatus
    disputes: int


class VerifyClaimRequest(_Strict):
    """A verifier asking for a record to re-check: its device arch and the backends it runs."""

    worker: Annotated[Line, Field(min_length=1, max_length=128)]
    device_arch: Name
    backends: Annotated[list[Backend], Field(min_length=1, max_length=3)]
    lease_seconds: LeaseSeconds = 600.0


def _first_ones(value: Any) -> Any:
    return value[:MAX_DISPUTED_PROBLEMS] if isinstance(value, list) else value


class VerifyTask(_Strict):
    """A record leased to a verifier, with the problems consumers disputed it at."""

    record: RecordPublic
    # A server lists the oldest 16 (cache_server.trust.MAX_TASK_PROBLEMS); a verifier runs each
    # once, the first MAX_DISPUTED_PROBLEMS of a longer list (an older server's): hours of work
    # a server cannot ask of it. Its finding says which it answers (the rest stay open).
    disputed_problems: Annotated[list[Problem], BeforeValidator(_first_ones)] = []
    lease_expires_at: Utc


class VerificationCreate(_Strict):
    """A verifier's finding on a leased record.

    ``outcome``: ``passed`` (re-validated; ``timing`` is the verifier's own), ``failed`` (a check
    failed: ``validation`` says which) or ``unverifiable`` (this verifier cannot run it: another
    environment, an unknown kernel; the record goes back to the queue).
    """

    worker: Annotated[Line, Field(min_length=1, max_length=128)]
    outcome: Literal["passed", "failed", "unverifiable"]
    device_name: Annotated[Line, Field(min_length=1, max_length=128)]
    timing: TimingModel | None = None
    validation: ValidationReport | None = None
    error: Annotated[Text, Field(max_length=2048)] = ""
    # The task's disputed problems this finding answers (run, or found beyond this machine);
    # None (an older verifier): those its task listed, worked out again by the server.
    disputed_problems: Annotated[list[Problem], Field(max_length=MAX_DISPUTED_PROBLEMS)] | None = (
        None
    )

    @model_validator(mode="after")
    def _consistent(self) -> VerificationCreate:
        if self.outcome == "passed" and (self.timing is None or self.validation is None
                                         or not self.validation.passed):  # fmt: skip
            raise ValueError("a passed verification carries the verifier's timing and a "
                             "validation that passed")  # fmt: skip
        failed = self.validation is not None and not self.validation.passed
        if self.outcome == "failed" and not failed and not self.error:
            raise ValueError("a failed verification carries the failed validation or an error")
        return self


def trust_text(record: RecordPublic) -> str:
    """Who vouches for the record, in a line: ``verified by cpu-verifier …``."""
    by = f"uploaded by {record.uploaded_by}" if record.uploaded_by else "uploaded"
    check = record.verification
    if record.status == "pending":
        return f"pending: validated by its uploader only ({by}; not verified)"
    if record.status == "disputed" and not record.disputes:  # "disputed 0x by consumers"
        return ("disputed: not served until re-verified; no consumer disputed this record "
                "itself: a copy of its config at this key was, or its uploader's token was "
                f"revoked with its records withdrawn ({by})")  # fmt: skip
    if record.status == "disputed":
        return f"disputed {record.disputes}x by consumers: not served until re-verified ({by})"
    if check is None:
        return f"{record.status} ({by})"
    verifier = name_text(check.verifier)
    if record.status == "rejected":
        return f"rejected by {verifier}: {check.error or 'its check failed'} ({by})"
    text = f"verified by {verifier} on {check.device_name} ({by})"
    if check.timing_flag and check.time_ratio is not None:
        text += (f"; the uploaded time was {check.time_ratio:.2f}x faster than the "
                 "verifier's: not believed")  # fmt: skip
    return text
