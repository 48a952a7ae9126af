"""A record knows the verify token whose finding decided it (``records.checked_by``): what a
leaked verify token passed stayed verified after its revocation (a pass was not tied to the token
that made it), and what it rejected stayed out. Revoking it with ``withdraw`` now disputes both
(cache_server.withdrawal).

Records stored before are given the token of their verifier's name where exactly one verify or
admin token has that name (a name is not unique; a trusted uploader's "NAME (trusted uploader)"
is no token's name), if a finding decided them: verified, rejected, or disputed again since. The
others keep none, and a revocation leaves them as before. A snapshot's record whose stated
verifier has the name of a token here is counted that token's (the two cannot be told apart):
withdrawn, it is checked again.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_records = sa.table(
    "records", sa.column("status", sa.String), sa.column("verification", sa.JSON),
    sa.column("checked_by", sa.Integer),
)  # fmt: skip
_tokens = sa.table(
    "tokens", sa.column("id", sa.Integer), sa.column("name", sa.String),
    sa.column("scope", sa.String),
)  # fmt: skip


def upgrade() -> None:
    op.add_column("records", sa.Column("checked_by", sa.Integer, nullable=True))
    op.create_index("ix_records_checked_by", "records", ["checked_by"])
    r, t = _records.c, _tokens.c
    verifier = r.verification["verifier"].as_string()
    sole = (
        sa.select(sa.func.min(t.id))
        .where(t.name == verifier, t.scope.in_(("verify", "admin")))
        .having(sa.func.count() == 1).scalar_subquery()
    )  # fmt: skip
    decided = sa.and_(r.status.in_(("verified", "rejected", "disputed")), verifier.is_not(None))
    op.get_bind().execute(_records.update().where(decided).values(checked_by=sole))


def downgrade() -> None:
    op.drop_index("ix_records_checked_by", table_name="records")
    # Not a batch (see 0012): SQLite >= 3.35 drops a column in place.
    op.drop_column("records", "checked_by")
