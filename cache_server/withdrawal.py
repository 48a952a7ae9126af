"""The records that stand on one token's word, and their withdrawal when it is revoked.

A record is served on the word of the token that put it here until a verifier of this server
passes it: pending (the default policy serves it), or verified at once from a trusted token (both
policies do); a snapshot's record on its importer's word. ``records.vouched_by`` names that token.
A verifier's finding stands on its verify token's word: the records it passed (and the twins
whose dispute its pass settled) are served on it, the ones it rejected kept out by it.
``records.checked_by`` names that token.

Revoking a token leaves those records as they are unless told to withdraw them: a routine
revocation (a teammate leaving, a token rotated) should not take their work out of service. An
admin who finds a token leaked withdraws them: each is ``disputed``, out of service under every
policy until another verifier checks it, as a consumer's dispute makes it; consumers fall back to
defaults meanwhile, never to a wrong result. A leaked verify token's rejections are questions
again too (an honest record it rejected is checked again, and served if it passes). Only the
token's own records and findings: a revocation is a finding about a token, not about a config, so
their twins (other uploads of the same config at the key) keep their standing, as a rejection
leaves an honest copy's (:mod:`cache_server.twins`). Records another verifier of this server
decided since, disputed ones, and unvalidated ones (never served) are left as they are (records
stored before migrations 0019 and 0020 were given their tokens by name: an imported one a verifier
here passed after its import counts as its importer's). A verify token is never handed its own
records to check (:func:`cache_server.trust.claim`): a record stands on its uploader's word until
another's pass. Keyword-only; nothing here commits.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from cache_server import jobs
from cache_server.models import RecordRow
from cache_server.trust import SERVED_STATUSES, recompute_winners, served
from tunecache.tokens import name_text

_SERVED = SERVED_STATUSES["validated"]  # every status some policy serves
_DECIDED = (*_SERVED, "rejected")  # and the one a verifier's failure keeps out


def _on_word_of(token_id: int) -> Any:
    return and_(RecordRow.validated.is_(True), or_(
        and_(RecordRow.vouched_by == token_id, RecordRow.status.in_(_SERVED)),
        and_(RecordRow.checked_by == token_id, RecordRow.status.in_(_DECIDED)),
    ))  # fmt: skip


def standing(session: Session, *, token_id: int) -> int:
    """How many records stand on token ``token_id``'s word: served on its word alone (its
    uploads and imports no verifier passed), or decided by its finding as a verifier."""
    return int(session.scalar(select(func.count()).where(_on_word_of(token_id))) or 0)


def withdraw(session: Session, *, token_id: int, name: str, policy: str) -> int:
    """Disputes every record standing on token ``token_id``'s word (claimable by a verifier at
    once) and hands each key's winner places on; a key ``policy`` then serves by none has the
    done jobs its records answered opened again (:func:`cache_server.jobs.reopen`, as a dispute
    does: a leaked token that completed misses with its uploads left them done, its keys
    untuned); ``name``: the token's, for the jobs' error. Called once the token's row is
    revoked in this transaction, with every key's lock held
    (:func:`cache_server.twins.lock_every_key`, which :func:`cache_server.tokens.revoke` takes
    after the token's row and before the leases' rows): each write of a record in flight ended
    before the records are read here (an upload of the token's authenticated before the
    revocation, a verifier's pass that gave a withdrawn twin its standing back), and every write
    after reads the revocation behind its key's lock. Writes wait while this runs (seconds for
    thousands of records). Returns how many records."""
    disputed = session.scalars(
        update(RecordRow)
        .where(_on_word_of(token_id))
        .values(status="disputed", verify_attempts=0)
        .returning(RecordRow.key_hash)
        .execution_options(synchronize_session=False)
    ).all()  # fmt: skip
    why = f"the records of token {name_text(name)} were withdrawn: its key is served by none"
    for key_hash in sorted(set(disputed)):
        recompute_winners(session, key_hash=key_hash)
        if not served(session, key_hash, policy):
            jobs.reopen(session, key_hash=key_hash, error=why)
    return len(disputed)
