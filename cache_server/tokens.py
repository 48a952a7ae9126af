"""Token query functions: issue (under a name no live token has: create), authenticate, list,
revoke. They never commit.

Only a token's SHA-256 is stored (:func:`tunecache.tokens.fingerprint`), with its first characters
for lists. ``last_used_at`` is written at most once a minute per token, so authenticated reads do
not each become a write.
"""

from __future__ import annotations

import unicodedata
from datetime import timedelta
from typing import Literal

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from cache_server import jobs, quota, trust, twins, withdrawal
from cache_server.db import upsert_insert
from cache_server.models import ArtifactRow, TokenRow, utcnow
from cache_server.queries import Revoked as Revoked  # re-exported: a revoked token's 401
from cache_server.twins import lock_slot
from tunecache.tokens import (
    MAX_LISTED_TOKENS,
    Scope,
    TokenPublic,
    TokenRevoked,
    fingerprint,
    new_token,
    shown_part,
)

LAST_USED_RESOLUTION = timedelta(minutes=1)


def public(row: TokenRow, *, stored_bytes: int | None = None) -> TokenPublic:
    """``row`` as the API shows it (``stored_bytes``: what it has stored, where that is read)."""
    shown = TokenPublic.model_validate(row, from_attributes=True)
    return (
        shown if stored_bytes is None else shown.model_copy(update={"stored_bytes": stored_bytes})
    )


def issue(
    session: Session, *, name: str, scope: Scope, trusted: bool = False
) -> tuple[str, TokenRow]:
    """A new random token: returns it (its only appearance in clear) and its stored row.

    ``trusted``: its uploads are served as verified at once, without a verifier.
    """
    token = new_token()
    row = TokenRow(name=name, scope=scope, prefix=shown_part(token),
                   secret_hash=fingerprint(token), trusted=trusted)  # fmt: skip
    session.add(row)
    session.flush()
    return token, row


class NameTaken(Exception):
    """A live token already goes by this name (compared as :func:`name_skeleton` makes it)."""


# Held while a new name is stored and checked (PostgreSQL): two concurrent creates of one name
# cannot both find it free. The number is arbitrary, this lock's ("tunename").
NAME_SLOT = 257  # past the keys' slots and the miss budget's (cache_server.jobs)


def name_skeleton(name: str) -> str:
    """What a name is compared as: NFKC (``ⅰ`` is ``i``), case-folded, blanks trimmed and runs of
    them one space, so ``"ops "``, ``"OPS"`` and ``"ops"`` are one name. A new name is ASCII
    (:data:`tunecache.tokens.NewTokenName`); this also catches older names that are not."""
    return " ".join(unicodedata.normalize("NFKC", name).casefold().split())


def create(
    session: Session, *, name: str, scope: Scope, trusted: bool = False
) -> tuple[str, TokenRow]:
    """:func:`issue` under a name no live token goes by: a token's name is who the dashboard and
    every record say uploaded or verified it, so two live tokens may not share one.

    The row is written first, then the live names read: on SQLite the write holds the database's
    write lock until the transaction ends (a read first sees no lock, and two creates both found
    the name free); on PostgreSQL a lock slot of its own (:data:`NAME_SLOT`), held to the
    transaction's end, orders them.

    Raises:
        NameTaken: a live (not revoked) token's name is ``name``, case and blanks aside; the
            caller's transaction must be rolled back (the session dependency does).
    """
    lock_slot(session, NAME_SLOT)
    token, row = issue(session, name=name, scope=scope, trusted=trusted)
    wanted = name_skeleton(name)
    live = session.execute(
        select(TokenRow.id, TokenRow.name).where(TokenRow.revoked_at.is_(None),
                                                 TokenRow.id != row.id)
    ).all()  # fmt: skip
    for token_id, taken in live:
        if name_skeleton(taken) == wanted:
            raise NameTaken(f"token {token_id} is already named {taken!r}, a live token: choose "
                            "another name, or revoke that token first")  # fmt: skip
    return token, row


BootstrapState = Literal["stored", "known", "revoked"]


def ensure(session: Session, *, token: str, name: str, scope: Scope) -> BootstrapState:
    """Stores a token chosen outside (the server's bootstrap token) unless it is known already.

    One statement, ``INSERT … ON CONFLICT DO NOTHING``, so several server processes starting at
    once store it once. A known token keeps its row: a revoked bootstrap token stays revoked.
    Whether the row was written is read from ``RETURNING``: the statement's ``rowcount`` is -1
    on psycopg, and a start-up on PostgreSQL said "stored" every time, a revoked token's too.

    Returns:
        ``stored`` now, ``known`` already (and live), or ``revoked``: known, and refused.
    """
    stmt = (
        upsert_insert(session, TokenRow)
        .values(
            name=name,
            scope=scope,
            prefix=shown_part(token),
            secret_hash=fingerprint(token),
            created_at=utcnow(),
        )
        .on_conflict_do_nothing(index_elements=["secret_hash"])
        .returning(TokenRow.id)
    )
    if session.execute(stmt).first() is not None:
        return "stored"
    revoked_at = session.scalar(
        select(TokenRow.revoked_at).where(TokenRow.secret_hash == fingerprint(token))
    )
    return "known" if revoked_at is None else "revoked"


def authenticate(session: Session, *, token: str) -> TokenRow | None:
    """The live (not revoked) token row of ``token``, or ``None``."""
    row = session.scalar(select(TokenRow).where(TokenRow.secret_hash == fingerprint(token)))
    if row is None or row.revoked_at is not None:
        return None
    now = utcnow()
    if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
        row.last_used_at = now
    return row


def scope_of(session: Session, *, token: str) -> Scope | None:
    """The scope of ``token`` when it is live, else ``None``; reads only (no ``last_used_at``)."""
    found = session.execute(
        select(TokenRow.scope, TokenRow.revoked_at).where(
            TokenRow.secret_hash == fingerprint(token)
        )
    ).first()
    if found is None or found.revoked_at is not None:
        return None
    return found.scope


def administrable(session: Session, *, bootstrap: str | None = None) -> bool:
    """Whether some live admin token exists, or ``bootstrap`` (the server's bootstrap token) is
    unknown yet, so that start-up stores it as one."""
    live_admin = select(TokenRow.id).where(TokenRow.scope == "admin",
                                           TokenRow.revoked_at.is_(None))  # fmt: skip
    if session.scalar(live_admin.limit(1)) is not None:
        return True
    if bootstrap is None:
        return False
    known = select(TokenRow.id).where(TokenRow.secret_hash == fingerprint(bootstrap))
    return session.scalar(known) is None


def list_tokens(session: Session, *, include_revoked: bool = False) -> list[TokenPublic]:
    """Every live token (and the revoked ones with ``include_revoked``), each with the bytes it
    has stored (:mod:`cache_server.quota`)."""
    stmt = select(TokenRow).order_by(TokenRow.id).limit(MAX_LISTED_TOKENS)
    if not include_revoked:
        stmt = stmt.where(TokenRow.revoked_at.is_(None))
    rows = list(session.scalars(stmt))
    used = quota.usage(session, [row.id for row in rows])
    return [public(row, stored_bytes=used.get(row.id, 0)) for row in rows]


class LastAdmin(Exception):
    """Revoking this token would leave no live admin token: nobody could manage tokens again."""


LAST_ADMIN = (
    "token {id} is the last live admin token: revoking it would lock every admin out of the API; "
    "create another first (tunecache token create --db URL --name NAME --scope admin)"
)


REVOKE_SLOT = 258  # past the keys', the miss budget's and token names' (NAME_SLOT)


def revoke(
    session: Session, *, token_id: int, withdraw: bool = False, by: int | None = None,
    policy: str = "validated",
) -> TokenRevoked | None:  # fmt: skip
    """Revokes a token (kept, for the record), giving back the leases of the jobs it claimed
    (:func:`cache_server.jobs.release_leases`) and of the records it was verifying
    (:func:`cache_server.trust.release_verifications`); with ``withdraw``, disputes the records
    served on its word alone (:func:`cache_server.withdrawal.withdraw`; ``policy``: the server's,
    which decides whether their keys are still served). ``None`` if there is no
    such token. A revoked token is revoked again at no cost (its first time kept): an admin who
    finds out later that it leaked withdraws its records then.

    ``by``: the admin token asking (through the API), refused if it was revoked meanwhile.

    Raises:
        LastAdmin: the token is the last live admin token (a token may revoke itself while
            another admin remains). Revocations take turns (:data:`REVOKE_SLOT`; on SQLite the
            database's write lock: a read alone takes none, and two admins revoking each other
            both found the other live and left none), and the live admin rows are locked while
            this is decided: a caller holding an admin row (its own, its last use written)
            commits it first.
        Revoked: ``by`` is no longer a live admin token (nothing is revoked).
    """
    lock_slot(session, REVOKE_SLOT)
    live_admins = session.scalars(
        select(TokenRow.id)
        .where(TokenRow.scope == "admin", TokenRow.revoked_at.is_(None))
        .order_by(TokenRow.id)  # locked in one order: two revocations take turns
        .with_for_update(key_share=True)  # NO KEY UPDATE
    ).all()
    if by is not None and by not in live_admins:
        raise Revoked("the token was revoked while this request ran: nothing was revoked")
    if list(live_admins) == [token_id]:
        raise LastAdmin(LAST_ADMIN.format(id=token_id))
    session.execute(
        update(TokenRow)
        .where(TokenRow.id == token_id, TokenRow.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )  # the token's row before every key's lock: a write of its holds the row (its last use)
    if withdraw:  # before the leases' rows: a verifier's finding takes its key's lock, then them
        session.execute(
            update(TokenRow)
            .where(TokenRow.id == token_id, TokenRow.withdrawn_at.is_(None))
            .values(withdrawn_at=utcnow())
        )  # fmt: skip
        twins.lock_every_key(session)
    jobs.release_leases(session, token_id=token_id)  # a revoked token holds no job
    trust.release_verifications(session, token_id=token_id)  # nor a record to verify
    row = session.get(TokenRow, token_id, populate_existing=True)
    if row is None:
        return None
    withdrawn = (withdrawal.withdraw(session, token_id=token_id, name=row.name, policy=policy)
                 if withdraw else 0)  # fmt: skip
    shared = session.scalar(select(func.count()).where(ArtifactRow.token_id == token_id))
    standing = withdrawal.standing(session, token_id=token_id)
    return TokenRevoked(**public(row, stored_bytes=quota.used(session, token_id)).model_dump(),
                        withdrawn=withdrawn, standing=standing, artifacts=shared or 0)  # fmt: skip
