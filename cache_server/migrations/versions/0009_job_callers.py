"""Jobs remember who leased them and who asked for them: the token that claimed a lease (only it,
or an admin token, may renew or end the lease), and the caller whose miss queued the job (each
caller's share of the jobs misses may create is counted by it).

A job running at the upgrade was leased by no token the server knows: its worker's next heartbeat
gets 409, and the job is claimed again when its lease ends (an admin token may still end it). Jobs
queued by misses before it count towards no caller's share.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("lease_token_id", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("requested_by", sa.String(64), nullable=True))
    op.create_index("ix_jobs_requested_by", "jobs", ["requested_by", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_requested_by", table_name="jobs")
    op.drop_column("jobs", "requested_by")
    op.drop_column("jobs", "lease_token_id")
