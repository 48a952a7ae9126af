"""Lookup rules: exact key → same arch on another device → nearest shape bucket → miss.

Every rule serves only validated winners whose kernel source, backend and dtype match, and whose
environment versions the caller's version policy admits. Query functions: they never commit.
"""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from cache_server.models import RecordRow, WinnerRow
from cache_server.queries import get_winner, public_record
from tunecache.canonical import canonical_json
from tunecache.policies import VersionPolicy, bucket_policy, shape_distance, versions_match
from tunecache.schemas import KeyModel, RecordPublic

Rule = Literal["exact", "same_arch", "bucket"]
RULES: tuple[Rule, ...] = ("exact", "same_arch", "bucket")


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON: in Python ``True == 1``, but a flag is not a size."""
    return canonical_json(a) == canonical_json(b)


def _rule(wanted: dict[str, Any], tuned: dict[str, Any]) -> Rule | None:
    """Which rule lets a record tuned for ``tuned`` serve ``wanted`` (versions aside), if any."""
    policy = bucket_policy(wanted["kernel"])
    if _same(tuned["problem"], wanted["problem"]):
        return "exact" if _same(tuned["device"], wanted["device"]) else "same_arch"
    if _same(policy.bucket(tuned["problem"]), policy.bucket(wanted["problem"])):
        return "bucket"
    return None


def find_winner(
    session: Session, *, key: KeyModel, policy: VersionPolicy = "strict"
) -> tuple[RecordPublic, Rule] | None:
    """The best record that may serve ``key`` under ``policy``, and the rule that matched."""
    if policy == "strict" and (hit := get_winner(session, key_hash=key.digest())) is not None:
        return hit, "exact"
    wanted = key.model_dump(mode="json", by_alias=True)
    rows = session.scalars(
        select(RecordRow)
        .join(WinnerRow, WinnerRow.record_id == RecordRow.id)
        .where(
            RecordRow.kernel == key.kernel,
            RecordRow.backend == key.backend,
            RecordRow.dtype == key.dtype,
            RecordRow.device_arch == key.device.arch,
        )
    ).all()
    ranked: list[tuple[int, float, float, int, RecordRow, Rule]] = []
    for row in rows:
        tuned = row.key
        if tuned["source_hash"] != wanted["source_hash"]:
            continue
        if not versions_match(wanted["environment"], tuned["environment"], policy):
            continue
        rule = _rule(wanted, tuned)
        if rule is None:
            continue
        distance = shape_distance(wanted["problem"], tuned["problem"])
        units = abs(tuned["device"]["units"] - wanted["device"]["units"])
        ranked.append((RULES.index(rule), distance, units, row.id, row, rule))
    if not ranked:
        return None
    *_, best, rule = min(ranked, key=lambda r: r[:4])
    return public_record(best, is_winner=True), rule
