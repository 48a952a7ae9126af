"""Jobs say what can run them (the backend and the device arch, as columns a claim filters on)
and how to tune them (the search strategy and the budget in trials; unset: the worker's own).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("backend", sa.String(16), nullable=True))
    op.add_column("jobs", sa.Column("device_arch", sa.String(128), nullable=True))
    op.add_column("jobs", sa.Column("strategy", sa.String(64), nullable=True))
    op.add_column("jobs", sa.Column("trials", sa.Integer(), nullable=True))
    jobs = sa.table(
        "jobs", sa.column("id", sa.Integer), sa.column("key", sa.JSON),
        sa.column("backend", sa.String), sa.column("device_arch", sa.String),
    )  # fmt: skip
    bind = op.get_bind()
    for job_id, key in bind.execute(sa.select(jobs.c.id, jobs.c.key)).all():
        target = {"backend": key["backend"], "device_arch": key["device"]["arch"]}
        bind.execute(jobs.update().where(jobs.c.id == job_id).values(**target))
    op.create_index("ix_jobs_target", "jobs", ["device_arch", "backend"])


def downgrade() -> None:
    op.drop_index("ix_jobs_target", table_name="jobs")
    op.drop_column("jobs", "trials")
    op.drop_column("jobs", "strategy")
    op.drop_column("jobs", "device_arch")
    op.drop_column("jobs", "backend")
