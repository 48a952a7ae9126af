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
    jobs = sa.table("jobs", sa.column("key", sa.JSON), sa.column("kernel", sa.String),
                    sa.column("source_hash", sa.String))  # fmt: skip
    # In one statement, the database reading each key (50,000 jobs one update each: 15 s on
    # PostgreSQL).
    kernel, source = jobs.c.key["kernel"].as_string(), jobs.c.key["source_hash"].as_string()
    op.get_bind().execute(jobs.update().values(kernel=kernel, source_hash=source))


def downgrade() -> None:
    op.drop_column("jobs", "source_hash")
    op.drop_column("jobs", "kernel")
