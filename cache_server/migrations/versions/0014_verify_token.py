"""A verifier's lease is held by its worker *and* the token it claimed with, as a job's is: a
worker's name is only what a verifier says it is, and another verify token naming the same worker
could settle the lease. A revoked token's verification leases are given back at once. Leases held
when this runs have no token: they stay the worker's until they end.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("records", sa.Column("verify_token_id", sa.Integer, nullable=True))


def downgrade() -> None:
    # Not a batch (see 0012): SQLite >= 3.35 drops a column in place.
    op.drop_column("records", "verify_token_id")
