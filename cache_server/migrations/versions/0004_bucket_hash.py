"""Records indexed by the bucket a lookup may match (tunecache.rules.bucket_digest).

A non-exact lookup used to load every winner of an arch into Python; with this column it reads
the winners of one bucket (and winners are indexed by record for the join). Existing records are
backfilled.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from tunecache.rules import bucket_digest

    op.add_column("records", sa.Column("bucket_hash", sa.String(64), nullable=True))
    records = sa.table(
        "records", sa.column("id", sa.Integer), sa.column("key", sa.JSON),
        sa.column("bucket_hash", sa.String),
    )  # fmt: skip
    bind = op.get_bind()
    rows = bind.execute(sa.select(records.c.id, records.c.key)).all()
    for row_id, key in rows:
        bind.execute(
            records.update().where(records.c.id == row_id).values(bucket_hash=bucket_digest(key))
        )
    op.create_index("ix_records_bucket_hash", "records", ["bucket_hash"])
    # The lookup joins a bucket's records to their winners: without this, by a scan of winners.
    op.create_index("ix_winners_record_id", "winners", ["record_id"])


def downgrade() -> None:
    op.drop_index("ix_winners_record_id", table_name="winners")
    op.drop_index("ix_records_bucket_hash", table_name="records")
    op.drop_column("records", "bucket_hash")
