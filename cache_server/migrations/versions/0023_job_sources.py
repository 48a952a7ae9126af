"""Jobs say their key's kernel and source hash as columns a claim filters on: a worker that
names the version of a kernel it runs is not handed a job of another version (it failed the
job, an attempt spent: a fleet half upgraded failed the new version's jobs).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("kernel", sa.String(128), nullable=True))
    op.add_column("jobs", sa.Column("source_hash", sa.String(128), nullable=True))
    jobs = sa.table(
        "jobs", sa.column("id", sa.Integer), sa.column("key", sa.JSON),
        sa.column("kernel", sa.String), sa.column("source_hash", sa.String),
    )  # fmt: skip
    # In one statement, the database reading each key (50,000 jobs one update each: 15 s on
    # PostgreSQL); one job at a time where PostgreSQL cannot read a key as text (a NUL in any
    # of its strings, which jobs queued before NUL was refused may hold).
    bind = op.get_bind()
    kernel, source = jobs.c.key["kernel"].as_string(), jobs.c.key["source_hash"].as_string()
    try:
        with bind.begin_nested():
            bind.execute(jobs.update().values(kernel=kernel, source_hash=source))
    except sa.exc.DBAPIError:
        for job_id, key in bind.execute(sa.select(jobs.c.id, jobs.c.key)).all():
            values = {"kernel": key.get("kernel"), "source_hash": key.get("source_hash")}
            bind.execute(jobs.update().where(jobs.c.id == job_id).values(**values))


def downgrade() -> None:
    op.drop_column("jobs", "source_hash")
    op.drop_column("jobs", "kernel")
