"""A token knows when its records were withdrawn (``tokens.withdrawn_at``): a twin on the word of
a token revoked without withdrawing (rotated, a teammate leaving) was never served again by
another verifier's pass of an honest copy, as if withdrawn, and each such twin cost a
verification of its own (cache_server.twins.settle).

Which tokens revoked before this were withdrawn was not recorded: every one is counted withdrawn
(its twins are checked each by a verifier, as before), never one of them taken for rotated (the
made-up record of a token withdrawn before the upgrade was served again by a copy's pass).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


_tokens = sa.table(
    "tokens", sa.column("revoked_at", sa.DateTime(timezone=True)),
    sa.column("withdrawn_at", sa.DateTime(timezone=True)),
)  # fmt: skip


def upgrade() -> None:
    op.add_column("tokens", sa.Column("withdrawn_at", sa.DateTime(timezone=True), nullable=True))
    t = _tokens.c
    op.get_bind().execute(
        _tokens.update().where(t.revoked_at.is_not(None)).values(withdrawn_at=t.revoked_at)
    )


def downgrade() -> None:
    # Not a batch (see 0012): SQLite >= 3.35 drops a column in place.
    op.drop_column("tokens", "withdrawn_at")
