"""Jobs are indexed by the record that answered them: when a verifier rejects a key's last
servable record, the jobs that record's key answered are opened again (``jobs.reopen``), a
lookup by record that otherwise reads every done job ever kept.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_answered", "jobs", ["record_id", "state"])


def downgrade() -> None:
    op.drop_index("ix_jobs_answered", table_name="jobs")
