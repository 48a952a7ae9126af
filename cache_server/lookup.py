"""The server's lookup: exact key → same arch on another device → nearest shape bucket → miss.

Every rule serves only validated winners whose kernel source, backend and dtype match, and whose
environment versions the caller's version policy admits (:mod:`tunecache.rules`, shared with
snapshots and warm starts). Query functions: they never commit.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from cache_server.models import RecordRow, WinnerRow
from cache_server.queries import get_winner, public_record
from tunecache.policies import VersionPolicy
from tunecache.rules import RULES, Rule, best
from tunecache.schemas import KeyModel, RecordPublic

__all__ = ["RULES", "Rule", "find_winner"]


def find_winner(
    session: Session, *, key: KeyModel, policy: VersionPolicy = "strict"
) -> tuple[RecordPublic, Rule] | None:
    """The best record that may serve ``key`` under ``policy``, and the rule that matched.

    SQL narrows the winners to the key's kernel, backend, dtype and arch; the rules
    (:mod:`tunecache.rules`) decide among those.
    """
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
        .order_by(RecordRow.id)
    ).all()
    found = best(wanted, ((row.key, row) for row in rows), policy)
    if found is None:
        return None
    row, rule = found
    return public_record(row, is_winner=True), rule
