"""What one token may store: the bytes of the records and artifacts it has stored, counted in
the database (``token_usage``) against the server's ``token_bytes`` (an admin token's are counted,
never bounded).

Without it a write token could fill the server's disk: records that fail validation or do not
win are stored all the same (for analysis), and so are artifacts, and a reviewer's client stored
27 uploads of 14.3 MiB in 15 s. Each is charged what it stores: a record its JSON as sent, trials
and all (``records.sent_bytes``); an artifact its value's canonical JSON with its names, each time
it is written (a copy replaced by a better score is charged again, never credited back: a credit
read before a concurrent replacement could be given twice, and usage would fall below what is
stored). Nothing is ever deleted, so a token's usage only grows; an upload over the quota is
refused whole (403, nothing stored) and waits in its client's outbox until an admin raises the
quota, or sends it with another token.

Every write that charges takes this table's row last, once its records' key locks and its
artifacts' rows are held, and holds nothing more until it commits: a charge waits for another
of the same token's only until that commits, and never in a circle (a revocation takes the
token's row and then every key's lock, never this row).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from cache_server.db import upsert_insert
from cache_server.models import TokenRow, TokenUsageRow
from tunecache.tokens import byte_size


class QuotaFull(Exception):
    """An upload would take a token past the server's ``token_bytes`` (nothing is stored)."""


def charge(
    session: Session, token: TokenRow | None, size: int, *, quota: int, what: str = "this upload"
) -> None:
    """Adds ``size`` bytes to ``token``'s usage in this transaction; an admin token (or none:
    written behind the API) is not bounded by ``quota``. ``what``: the bytes' name in a refusal.

    Raises:
        QuotaFull: ``token``'s usage with ``size`` would pass ``quota`` (nothing is added).
    """
    if token is None or size <= 0:
        return
    bounded = token.scope != "admin"
    if bounded and size > quota:
        raise QuotaFull(_refusal(token, what, size, quota, used(session, token.id)))
    stmt = upsert_insert(session, TokenUsageRow).values(token_id=token.id, stored_bytes=size)
    grown = TokenUsageRow.stored_bytes + stmt.excluded.stored_bytes
    stmt = stmt.on_conflict_do_update(
        index_elements=[TokenUsageRow.token_id],
        set_={"stored_bytes": grown},
        where=(grown <= quota) if bounded else None,
    )
    # RETURNING gives a row exactly when the usage grew (the WHERE held, or the row is new).
    if session.execute(stmt.returning(TokenUsageRow.token_id)).first() is None:
        raise QuotaFull(_refusal(token, what, size, quota, used(session, token.id)))


def used(session: Session, token_id: int) -> int:
    """The bytes token ``token_id`` has stored (since migration 0022: before, none counted)."""
    found = session.scalar(
        select(TokenUsageRow.stored_bytes).where(TokenUsageRow.token_id == token_id)
    )
    return int(found or 0)


def usage(session: Session, token_ids: list[int]) -> dict[int, int]:
    """Each of ``token_ids``' stored bytes (a token that stored nothing: absent)."""
    if not token_ids:
        return {}
    rows = session.execute(
        select(TokenUsageRow.token_id, TokenUsageRow.stored_bytes)
        .where(TokenUsageRow.token_id.in_(token_ids))
    ).all()  # fmt: skip
    return {token_id: int(stored) for token_id, stored in rows}


def _refusal(token: TokenRow, what: str, size: int, quota: int, held: int) -> str:
    return (
        f"token {token.name!r} has stored {byte_size(held)} of its quota of {byte_size(quota)} "
        f"(TUNECACHE_SERVER_TOKEN_BYTES): {what} ({byte_size(size)}) does not fit, and nothing "
        "of it was stored; an admin may raise the quota"
    )
