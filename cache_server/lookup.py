"""The server's lookup: exact key → same arch on another device → nearest shape bucket → miss.

Every rule serves only validated winners whose kernel source, backend and dtype match, and whose
environment versions the caller's version policy admits (:mod:`tunecache.rules`, shared with
snapshots and warm starts). Query functions: they never commit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy.orm import Session

from cache_server.models import RecordRow
from cache_server.queries import BUCKET_SIZE, BUCKET_WINNERS, get_winner, public_record
from cache_server.trust import SERVED_STATUSES, winner_table
from cache_server.twins import refused_at
from tunecache.policies import BucketPolicy, VersionPolicy, server_bucket
from tunecache.rules import RULES, Rule, best, bucket_digest
from tunecache.schemas import KeyModel, RecordPublic

__all__ = ["RANK_FREE", "RULES", "Rule", "find_winner"]

# Winners of a bucket a lookup ranks in the API's own slots (about 40 us each); more, and it
# ranks in a lane of its own (cache_server.api.shedding.LoadShedding.move).
RANK_FREE = 64
# Winners a lookup finds out of service as it reads them (a dispute or a rejection committed
# meanwhile) before it answers a miss: each one found reads and ranks the bucket again.
RECHECKS = 4


def find_winner(
    session: Session, *, key: KeyModel, policy: VersionPolicy = "strict",
    serving: str = "validated", bucket: Sequence[str] | None = None,
    ranking: Callable[[int], None] | None = None,
) -> tuple[RecordPublic, Rule] | None:  # fmt: skip
    """The best record that may serve ``key`` under ``policy``, and the rule that matched.

    ``bucket``: the dimensions the caller's kernel rounds to a power of two (its bucket policy),
    for a kernel the server does not know (a user's; ``None``: none, exact shapes); a built-in
    kernel's are the server's own, whatever the caller says.

    Only the winners of the server's serving policy are candidates (``validated``: pending and
    verified records; ``verified``: verified ones). An index narrows them to those of the key's
    bucket (:func:`~tunecache.rules.bucket_digest`: kernel, source, backend, dtype, arch,
    bucketed problem), a handful however large the cache; the rules (:mod:`tunecache.rules`)
    decide among those, less the configs that stand refused at ``key`` itself
    (:func:`~cache_server.twins.refused_at`: disputed there, another device's copy is not served
    in their place).

    ``ranking``: called with the bucket's size before ranking more than :data:`RANK_FREE`
    winners (what it raises, the lookup raises): the route moves the request to a lane of its
    own there.
    """
    table = winner_table(serving)
    # The key's own winner first, whatever the version policy: its environment is the key's, so
    # every policy admits it, and no rule ranks before it (a compatible lookup of a tuned key
    # ranked its whole bucket, and could be refused where the bucket was large)
    if (hit := get_winner(session, key_hash=key.digest(), table=table)) is not None:
        return hit, "exact"
    wanted = key.model_dump(mode="json", by_alias=True)
    asked = {"bucket_hash": bucket_digest(wanted)}
    if (
        ranking is not None
        and (size := session.execute(BUCKET_SIZE[table], asked).scalar_one()) > RANK_FREE
    ):
        ranking(size)
    known = server_bucket(key.kernel)
    buckets = BucketPolicy(tuple(bucket or ())) if known is None else known
    for _ in range(RECHECKS):
        candidates = session.execute(BUCKET_WINNERS[table], asked).all()
        # a config disputed here is served by no rule either (asked only when there is a
        # candidate: a miss, the lookup's common cold answer, pays no extra query)
        refused = refused_at(session, key.digest()) if candidates else set()
        choices = ((tuned, record_id) for record_id, tuned, digest in candidates
                   if digest is None or digest not in refused)  # fmt: skip
        if (found := best(wanted, choices, policy, buckets)) is None:
            return None
        record_id, rule = found
        # Read in a statement of its own, after the bucket's winners: a dispute or a rejection
        # committed between the two took it out of service (a reviewer's lookups racing one
        # dispute were answered with the disputed record 52 times in 1,553 on PostgreSQL). The
        # bucket is read again: the finding may have made another record its key's winner.
        row = session.get(RecordRow, record_id)
        if row is not None and row.validated and row.status in SERVED_STATUSES[serving]:
            return public_record(row, is_winner=True), rule
    return None
