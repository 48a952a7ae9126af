"""Records, trials and winners.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "records",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("kernel", sa.String(128), nullable=False),
        sa.Column("backend", sa.String(16), nullable=False),
        sa.Column("dtype", sa.String(32), nullable=False),
        sa.Column("device_arch", sa.String(128), nullable=False),
        sa.Column("device_name", sa.String(128), nullable=False),
        sa.Column("key", sa.JSON(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("config_summary", sa.String(256), nullable=False),
        sa.Column("time_ms", sa.Float(), nullable=False),
        sa.Column("timing", sa.JSON(), nullable=False),
        sa.Column("baselines", sa.JSON(), nullable=False),
        sa.Column("validated", sa.Boolean(), nullable=False),
        sa.Column("max_rel_error", sa.Float(), nullable=True),
        sa.Column("validation", sa.JSON(), nullable=False),
        sa.Column("search", sa.JSON(), nullable=False),
        sa.Column("provenance", sa.JSON(), nullable=False),
        sa.Column("trial_count", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_records_key_hash", "records", ["key_hash"])
    op.create_index("ix_records_kernel_backend_dtype", "records", ["kernel", "backend", "dtype"])
    op.create_table(
        "trials",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "record_id",
            sa.Integer(),
            sa.ForeignKey("records.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("time_ms", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=False),
    )
    op.create_index("ix_trials_record_id", "trials", ["record_id"])
    op.create_table(
        "winners",
        sa.Column("key_hash", sa.String(64), primary_key=True),
        sa.Column(
            "record_id",
            sa.Integer(),
            sa.ForeignKey("records.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("time_ms", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("winners")
    op.drop_index("ix_trials_record_id", "trials")
    op.drop_table("trials")
    op.drop_index("ix_records_kernel_backend_dtype", "records")
    op.drop_index("ix_records_key_hash", "records")
    op.drop_table("records")
