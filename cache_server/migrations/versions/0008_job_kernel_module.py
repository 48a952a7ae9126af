"""Jobs say which module their kernel comes from (a user's ``package.module:Class``; NULL for a
built-in kernel), as a column a claim filters on: a worker is only handed kernels it may import.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("kernel_module", sa.String(128), nullable=True))
    jobs = sa.table(
        "jobs", sa.column("id", sa.Integer), sa.column("key", sa.JSON),
        sa.column("kernel_module", sa.String),
    )  # fmt: skip
    bind = op.get_bind()
    for job_id, key in bind.execute(sa.select(jobs.c.id, jobs.c.key)).all():
        kernel = key["kernel"]
        if ":" in kernel:
            module = kernel.partition(":")[0]
            bind.execute(jobs.update().where(jobs.c.id == job_id).values(kernel_module=module))


def downgrade() -> None:
    op.drop_column("jobs", "kernel_module")
