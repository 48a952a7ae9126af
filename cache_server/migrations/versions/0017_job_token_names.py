"""A job says which token holds its lease and which token reported its error: the lease's
worker name and the error's text are the claimant's own words (a write token claimed a job as
"ci-runner-1 (verified CI)" and failed it with a forged log line, and the jobs page showed both
as fact). ``error_by`` is the reporting token's name, ``""`` for an error the server wrote; jobs
stored before: NULL (not known, and shown so).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("lease_token_name", sa.String(128), nullable=True))
    op.add_column("jobs", sa.Column("error_by", sa.String(128), nullable=True))


def downgrade() -> None:
    # Not a batch (see 0012): SQLite >= 3.35 drops a column in place.
    op.drop_column("jobs", "error_by")
    op.drop_column("jobs", "lease_token_name")
