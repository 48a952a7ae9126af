"""What each token has stored, counted against the server's quota (``token_usage``:
cache_server.quota): a write token could fill the disk with records that never win, artifacts
and failed jobs.

What tokens stored before this is not counted (a record's token was known by name only, and
names repeat): each token's usage starts at none, and the quota bounds what it stores from now.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "token_usage",
        sa.Column("token_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("stored_bytes", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("token_usage")
