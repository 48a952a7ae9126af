"""Records carry what makes an upload the same upload (its token and every field it sent),
unique: an upload sent again, because its answer was lost or its outbox was pushed twice, is
answered with the record stored the first time instead of storing a second one. Records stored
before have none (each stays as it was).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("records", sa.Column("upload_digest", sa.String(64), nullable=True))
    op.create_index("ux_records_upload_digest", "records", ["upload_digest"], unique=True)


def downgrade() -> None:
    op.drop_index("ux_records_upload_digest", table_name="records")
    # Not a batch: SQLite's batch mode copies the table and drops the old one, and with foreign
    # keys on, that drop deletes every winner and trial of its records. SQLite >= 3.35 drops a
    # column in place.
    op.drop_column("records", "upload_digest")
