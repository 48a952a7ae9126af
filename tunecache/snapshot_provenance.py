"""What a snapshot states of each record's provenance, as the server that exported it knew it.

A snapshot's ``timing`` is the time its server believed (a verifier's, once one re-timed the
record), so an import elsewhere cannot revive an uploader's time a verifier did not confirm. Without
more, the importing server could not tell who measured what: it credited the verifier's time to
the key's device, its uploader's speedups lost their "not re-timed" caveat, the importer's name
replaced the uploader's, the import's time the record's, and a trusted importer's token made a
never-verified record verified. A :class:`RecordProvenance` per record (``provenance``, in the
order of ``records``) states each: the status, who uploaded it and when, who verified it on which
device, the uploader's own time where the snapshot carries a verifier's, and which figures are the
uploader's own. An importer never gains trust from it (``cache_server.snapshots``): a pending record
stays pending, and a verified one is verified only where a trusted token vouches for the file.

A snapshot without ``provenance`` (written before it existed) states nobody's word: each record is
imported pending, its uploader unnamed.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, AwareDatetime, BeforeValidator, Field, model_validator

from tunecache.measured import TimingModel
from tunecache.schemas import Line, RecordCreate
from tunecache.strict import Strict, in_utc
from tunecache.tokens import NAME_CHARACTERS, TokenName

TIMING = "timing"  # in ``uploaders``: the record's time is its uploader's own
# A verifier is a token's name, or a trusted uploader's ("ci (trusted uploader)").
_VERIFIER = rf"^{NAME_CHARACTERS}( \(trusted uploader\))?$"
VerifierName = Annotated[str, Field(min_length=1, max_length=160, pattern=_VERIFIER)]
# A date as stated: an import takes one past its own time as its own time
# (cache_server.snapshots), never refuses it: refused at read, one row dated ahead of a host's
# clock (hosts' clocks differ) failed every export of that host, and a reader whose clock was
# behind the exporter's ignored the whole file. It must carry its zone; it is kept in UTC. It is
# an ISO 8601 date (pydantic read "0" and "-1" as Unix times: an importer stated records made in
# 1969), and one before 2000 is taken as 2000 (no record is as old; refused, a server holding one
# imported before could no longer export).
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)


def _iso_date(value: object) -> object:
    if isinstance(value, int | float) or (
        isinstance(value, str) and not re.match(r"\d{4}-\d{2}-\d{2}[Tt _]", value)
    ):
        raise ValueError("a date must be ISO 8601, as 2026-01-31T12:00:00Z")
    return value


Stamp = Annotated[AwareDatetime, BeforeValidator(_iso_date), AfterValidator(in_utc),
                  AfterValidator(lambda at: max(at, EARLIEST))]  # fmt: skip


class StatedVerification(Strict):
    """A verifier's finding as the exporting server holds it (only passed ones are exported).

    ``retimed``: the snapshot's ``timing`` is this verifier's, measured on ``device_name`` (else
    it is its uploader's: a trusted uploader's token verifies without re-timing)."""

    verifier: VerifierName
    device_name: Annotated[Line, Field(min_length=1, max_length=128)]
    verified_at: Stamp
    retimed: bool


class RecordProvenance(Strict):
    """Who measured and vouched for one record of a snapshot, as its exporting server knew it.

    ``uploaders`` names the figures that are the uploader's own measurements, never re-timed:
    ``"timing"`` (unless a verifier re-timed it) and every baseline (a verifier re-times a
    config, never its baselines). ``uploader_timing`` is the uploader's own time where the
    snapshot's ``timing`` is a verifier's: shown as the uploader's claim, never ranked by.
    """

    status: Literal["pending", "verified"]
    uploaded_by: TokenName | None = None
    created_at: Stamp
    verification: StatedVerification | None = None
    uploader_timing: TimingModel | None = None
    uploaders: Annotated[list[str], Field(max_length=17)]

    @model_validator(mode="after")
    def _consistent(self) -> RecordProvenance:
        if self.status == "verified" and self.verification is None:
            raise ValueError("a verified record states its verification")
        retimed = self.verification is not None and self.verification.retimed
        if retimed != (self.uploader_timing is not None):
            raise ValueError("uploader_timing is stated exactly where a verifier re-timed the "
                             "record (verification.retimed)")  # fmt: skip
        return self

    @property
    def retimed(self) -> bool:
        """Whether the record's ``timing`` is a verifier's."""
        return self.verification is not None and self.verification.retimed


def stated_for(record: RecordCreate, stated: RecordProvenance) -> str | None:
    """Why ``stated`` cannot be ``record``'s provenance (``None``: it can): its ``uploaders``
    must name exactly the record's figures its uploader measured."""
    names = [b.name for b in record.baselines]
    expected = names if stated.retimed else [TIMING, *names]
    if sorted(stated.uploaders) != sorted(expected):
        return (f"uploaders: {stated.uploaders} are not the record's own figures, "
                f"{expected} (a verifier re-times the timing only)")  # fmt: skip
    return None


def uploaders_of(record: RecordCreate, *, retimed: bool) -> list[str]:
    """The figures of ``record`` its uploader measured (``retimed``: its timing is a verifier's)."""
    return [*([] if retimed else [TIMING]), *(b.name for b in record.baselines)]
