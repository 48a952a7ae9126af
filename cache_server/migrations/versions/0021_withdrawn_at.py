"""A token knows when its records were withdrawn (``tokens.withdrawn_at``): a twin on the word of
a token revoked without withdrawing (rotated, a teammate leaving) was never served again by
another verifier's pass of an honest copy, as if withdrawn, and each such twin cost a
verification of its own (cache_server.twins.settle).

Tokens withdrawn before this are not known as such (none was recorded): their twins are served
again by a pass, as before 0019; an admin withdraws such a token again to record it (a revoked
token is revoked again at no cost, and its records still standing are withdrawn then).

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


def upgrade() -> None:
    op.add_column("tokens", sa.Column("withdrawn_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # Not a batch (see 0012): SQLite >= 3.35 drops a column in place.
    op.drop_column("tokens", "withdrawn_at")
