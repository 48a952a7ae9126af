"""Room in a shape bucket: how many winners a new key may join there, and whose they are.

A bucket (:func:`tunecache.rules.bucket_digest`: kernel, source, backend, dtype, arch, the
rounded problem) is what a non-exact lookup ranks, so it holds at most ``limit`` winners
(``TUNECACHE_SERVER_BUCKET_WINNERS``), twice that with trusted or admin tokens' keys: 20,000
made its lookups 0.7 s, from 8 ms. A bucket full
of one write token's winners (4,094 copies of one record under made-up torch versions, one
6 MB import) refused every other token's new key there, a team's CI included, until an admin
withdrew the token. So a token that is neither trusted nor an admin adds new keys to a bucket
only while it holds less than half the limit there (a sweep of every length in 2,049-4,096, a
user's kernel's bucket, fits in the default's half); a trusted or admin token's new key is
refused only at twice the limit, past what the others may fill. A token holds the winners on its
word alone (``vouched_by``: those it uploaded or imported that no verifier of this server has
passed since), by id: a new token of a revoked one's name holds none of them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import case, func, select

from cache_server.models import RecordRow, TokenRow, WinnerRow
from tunecache.tokens import grants

SETTING = "TUNECACHE_SERVER_BUCKET_WINNERS"


def winners(token: TokenRow | None) -> Any:
    """Each bucket's winners (the default policy's), and how many of them are on ``token``'s
    word alone, as ``(bucket_hash, held, own)`` rows (filter it by bucket)."""
    mine = RecordRow.vouched_by == (None if token is None else token.id)
    own = func.coalesce(func.sum(case((mine, 1), else_=0)), 0)
    return (
        select(RecordRow.bucket_hash, func.count(), own)
        .select_from(WinnerRow)
        .join(RecordRow, WinnerRow.record_id == RecordRow.id)
        .group_by(RecordRow.bucket_hash)
    )


def refusal(held: int, own: int, limit: int, token: TokenRow | None) -> str | None:
    """Why a new key's winner may not join a bucket that holds ``held`` winners, ``own`` of
    them ``token``'s (``None``: no token, as on a server without auth), or ``None`` when it
    may."""
    if token is not None and (token.trusted or grants(token.scope, "admin")):  # type: ignore[arg-type]
        if held >= 2 * limit:
            return (f"holds {_winners(held)}, twice the server's limit of {limit:,} ({SETTING}) "
                    "or more, which a trusted or admin token may fill")  # fmt: skip
        return None
    if held >= limit:  # more where trusted or admin tokens added past it
        return f"holds {_winners(held)}, the server's limit of {limit:,} ({SETTING}) or more"
    share = max(1, limit // 2)
    if token is not None and own >= share:
        return (f"holds {_winners(own)} on this token's word, half the server's limit "
                f"({SETTING}), as many as one token may add there (a trusted token may add "
                "more)")  # fmt: skip
    return None


def _winners(count: int) -> str:
    return f"{count:,} winner{'' if count == 1 else 's'}"
