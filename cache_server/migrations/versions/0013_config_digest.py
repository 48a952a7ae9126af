"""Records carry their config's canonical digest, indexed with their key's hash: a dispute or a
verifier's rejection of one record is a question for the key's other records of the same config
(cache_server.twins), found by the index, not by reading every config of the key. Records stored
before get theirs now.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from __future__ import annotations

import hashlib
import json

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_BATCH = 1000


def _digest(config: object, kernel: str, backend: str) -> str | None:
    """The digest of the config as it runs (cache_server.twins.config_digest, as new records')."""
    from tunecache.configcheck import as_run

    try:
        value = json.loads(config) if isinstance(config, str) else config
    except ValueError:
        return None
    shown = as_run(backend, value, kernel=kernel)
    return None if shown is None else hashlib.sha256(shown.encode("utf-8")).hexdigest()


def upgrade() -> None:
    op.add_column("records", sa.Column("config_digest", sa.String(64), nullable=True))
    op.create_index("ix_records_key_config", "records", ["key_hash", "config_digest"])
    records = sa.table("records", sa.column("id", sa.Integer), sa.column("config", sa.JSON),
                       sa.column("kernel", sa.String), sa.column("backend", sa.String),
                       sa.column("config_digest", sa.String))  # fmt: skip
    fill = records.update().where(records.c.id == sa.bindparam("row_id"))
    fill = fill.values(config_digest=sa.bindparam("value"))
    bind, after = op.get_bind(), 0
    while batch := bind.execute(
        sa.select(records.c.id, records.c.config, records.c.kernel, records.c.backend)
        .where(records.c.id > after)
        .order_by(records.c.id).limit(_BATCH)
    ).all():  # fmt: skip
        bind.execute(fill, [{"row_id": i, "value": _digest(config, kernel, backend)}
                            for i, config, kernel, backend in batch])  # fmt: skip
        after = batch[-1][0]


def downgrade() -> None:
    op.drop_index("ix_records_key_config", table_name="records")
    # Not a batch (see 0012): SQLite >= 3.35 drops a column in place.
    op.drop_column("records", "config_digest")
