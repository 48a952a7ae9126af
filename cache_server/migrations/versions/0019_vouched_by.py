"""A record knows the token on whose word alone it is served (``records.vouched_by``): revoking a
token left every record it uploaded in service, pending ones under the default policy and a
trusted token's verified ones under both, and an admin who found a leaked token had to dispute
its records one by one. Revoking with ``withdraw`` now disputes them (cache_server.withdrawal).

Records stored before are given the token of their uploader's name (their importer's, for a
snapshot's) where exactly one token has that name (a name is not unique), if they stand on its
word: pending, verified by that token's own word (a trusted token's upload or import), or
disputed before a verifier passed them (a dispute of a twin: a verifier's pass of the twin must
not serve them again once the token is revoked, :func:`cache_server.twins.settle`). The others
keep none, and a revocation leaves them as before. An imported record a verifier here passed
after its import is counted its importer's (the two cannot be told apart): withdrawn, it is
checked again.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

_records = sa.table(
    "records", sa.column("status", sa.String), sa.column("uploaded_by", sa.String),
    sa.column("imported_by", sa.String), sa.column("verification", sa.JSON),
    sa.column("vouched_by", sa.Integer),
)  # fmt: skip
_tokens = sa.table("tokens", sa.column("id", sa.Integer), sa.column("name", sa.String))


def upgrade() -> None:
    op.add_column("records", sa.Column("vouched_by", sa.Integer, nullable=True))
    op.create_index("ix_records_vouched_by", "records", ["vouched_by"])
    r, t = _records.c, _tokens.c
    putter = sa.func.coalesce(r.imported_by, r.uploaded_by)
    sole = (
        sa.select(sa.func.min(t.id)).where(t.name == putter)
        .having(sa.func.count() == 1).scalar_subquery()
    )  # fmt: skip
    never_passed = sa.or_(r.verification.is_(None), sa.cast(r.verification, sa.Text) == "null")
    own_word = sa.and_(r.status.in_(("pending", "verified", "disputed")), sa.or_(
        r.status == "pending",
        never_passed,  # disputed before any verifier passed it: its standing was its uploader's
        # Verified at import (the trusted importer's word; one a verifier here passed after its
        # import cannot be told apart: it is counted the importer's, re-checked if withdrawn),
        # or at upload, a trusted token's.
        r.imported_by.is_not(None),
        sa.cast(r.verification, sa.Text).like("%(trusted uploader)%"),
    ))  # fmt: skip
    op.get_bind().execute(_records.update().where(own_word).values(vouched_by=sole))


def downgrade() -> None:
    op.drop_index("ix_records_vouched_by", table_name="records")
    # Not a batch (see 0012): SQLite >= 3.35 drops a column in place.
    op.drop_column("records", "vouched_by")
