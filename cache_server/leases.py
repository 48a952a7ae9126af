"""What every lease (a job's, a verifier's) needs first: the token it is taken with, live, read
under a share lock. On PostgreSQL a claim that read the token live just before a revocation
committed leased a record or a job that the revocation's release had already passed over: the
lease outlived the token until it ran out. The share lock waits for a revocation in flight to
commit and then reads it; a revocation that comes after waits for the claim, then releases its
lease. SQLite serialises writers: there, the read alone is enough.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from cache_server.models import TokenRow


def token_live(session: Session, token_id: int) -> bool:
    """Whether token ``token_id`` exists and is not revoked, read under a share lock of its row
    (held until the transaction ends)."""
    revoked = session.execute(
        select(TokenRow.revoked_at).where(TokenRow.id == token_id).with_for_update(read=True)
    ).first()
    return revoked is not None and revoked[0] is None
