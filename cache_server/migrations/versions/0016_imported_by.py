"""A record imported from a snapshot keeps who uploaded it and who imported it: the importer's
token name was stored as its uploader, and the snapshot's uploader was lost (an import by a CI
token read "uploaded by ci-sync"). ``imported_by`` names the importing token; ``uploaded_by`` of
such a record is the uploader its snapshot named. Records stored before are uploads: NULL.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("records", sa.Column("imported_by", sa.String(128), nullable=True))


def downgrade() -> None:
    # Not a batch (see 0012): SQLite >= 3.35 drops a column in place.
    op.drop_column("records", "imported_by")
