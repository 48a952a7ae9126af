"""The artifact store: Inductor autotune choices and MetaSchedule records, as their own JSON.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "artifacts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("namespace", sa.String(32), nullable=False),
        sa.Column("partition", sa.String(256), nullable=False),
        sa.Column("key", sa.String(256), nullable=False),
        sa.Column("item", sa.String(128), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_artifacts_name", "artifacts", ["namespace", "partition", "key"])


def downgrade() -> None:
    op.drop_index("ix_artifacts_name", table_name="artifacts")
    op.drop_table("artifacts")
