"""What a lookup answers: the config to launch, where it came from, and what the served record
says about it (:class:`LookupResult`). The resolver (:mod:`tunecache.resolver`) makes them; the
integrations, ``best`` and the CLI read them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Literal

from tunecache.policies import VersionPolicy
from tunecache.rules import Rule
from tunecache.schemas import RecordCreate, RecordPublic

SourceName = Literal["memo", "snapshot", "server", "default"]


@dataclass(frozen=True)
class LookupResult:
    """What a lookup found: the config to launch, where it came from, and the record on a hit.

    ``record`` is the server's record on a memo or server hit; a snapshot hit has none (a snapshot
    holds the winners' data without server ids), but is still a :attr:`hit`. ``rule`` says which
    lookup rule matched (:mod:`tunecache.rules`: ``exact``, ``same_arch``, ``bucket``) and
    ``policy`` under which version policy; both are ``None`` for the default. ``time_ms``,
    ``device`` (``arch name``) and ``problem`` say what the served record was timed at, where
    (``time_ms``: the verifier's time once a verifier re-timed it, else the uploader's claim;
    ``device``: the device that measured ``time_ms``).
    """

    config: dict[str, Any] | None
    source: SourceName
    record: RecordPublic | None = None
    rule: Rule | None = None
    policy: VersionPolicy | None = None
    time_ms: float | None = None
    device: str | None = None
    problem: dict[str, Any] | None = None
    # The record served (a snapshot's too): what the properties below read, on demand only.
    served_record: RecordCreate | None = field(default=None, repr=False, compare=False)

    @classmethod
    def served(cls, record: RecordCreate, source: SourceName, rule: Rule | None,
               policy: VersionPolicy | None) -> LookupResult:  # fmt: skip
        """The answer that serves ``record`` (a server's :class:`RecordPublic` is kept)."""
        public = record if isinstance(record, RecordPublic) else None
        timing = record.timing if public is None else public.believed_timing
        timed_on = record.key.device.name if public is None else public.timed_on
        return cls(
            record.config, source, public, rule, policy, timing.median_ms,
            f"{record.key.device.arch} {timed_on}", dict(record.key.problem), record,
        )  # fmt: skip

    @property
    def eager_ms(self) -> float | None:
        """torch eager as the record's interleaved comparison timed it (``None``: no record, or
        no eager baseline)."""
        baselines = () if self.served_record is None else self.served_record.comparisons()
        return next((b.timing.median_ms for b in baselines if b.name == "torch_eager"), None)

    @property
    def vs_eager(self) -> str | None:
        """The winner against torch eager with its interval (:func:`tunecache.timing.versus`)."""
        from tunecache.timing import versus

        if self.served_record is None or self.eager_ms is None:
            return None
        return versus(self.served_record, than="torch eager")

    @property
    def slower_than_eager(self) -> bool:
        return self.served_record is not None and self.served_record.slower_than_eager

    @property
    def noisy(self) -> bool:
        return self.served_record is not None and self.served_record.noisy

    @property
    def hit(self) -> bool:
        return self.source != "default"

    def own(self) -> LookupResult:
        """This answer with a config and problem of the caller's own: what a caller does to them
        (``config.pop("num_warps")``) never reaches the memo, the record or another caller's
        answer. Nested values are copied too; a flat config costs a dict copy (about 1 µs in
        all: a memo hit is still a dict lookup, give or take)."""
        copied = object.__new__(LookupResult)  # as dataclasses.replace, in half its time
        fields = copied.__dict__
        fields.update(self.__dict__)
        fields["config"], fields["problem"] = _copied(self.config), _copied(self.problem)
        return copied


def _copied(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    copied = dict(value)
    for name, item in copied.items():
        if isinstance(item, dict | list):
            copied[name] = copy.deepcopy(item)
    return copied
