"""Adds what migrations edited after their release left out (going back drops nothing).

Migrations 0004, 0005, 0007 and 0015 were edited after the commits that added them, and a
database one of their first versions migrated reached the head without what the edits added:
from 0004's first version no index of winners by record (a bucket lookup scanned every winner);
from 0005's no ``jobs.strategy`` or ``jobs.trials`` (every job call answered 500); from 0007's no
``records.verify_claimed_at``, ``artifacts.uploaded_by`` or ``artifacts.trusted`` (0015 could
not run); from 0015's no ``artifacts.item_digest``, ``ix_artifacts_item`` on the item's columns
rather than on that digest, and no ``ix_artifacts_name`` (500s on artifacts). Each is added here
only where it is absent, with what the edited migration gives it: ``trusted`` false, the item's
digest filled in as 0015 fills it; a database the current versions migrated is left as it is.

Going back drops nothing: a database at 0017 has all of it (the current migrations add it), and
each earlier downgrade drops it as it would have.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_BATCH = 1000


def _columns() -> list[tuple[str, sa.Column[Any]]]:
    """Each column as the edited migration that adds it declares it (0005, 0007, 0015), made
    anew for each run: a column joins the table it is added to."""
    return [
        ("jobs", sa.Column("strategy", sa.String(64), nullable=True)),
        ("jobs", sa.Column("trials", sa.Integer(), nullable=True)),
        ("records", sa.Column("verify_claimed_at", sa.DateTime(timezone=True), nullable=True)),
        ("artifacts", sa.Column("uploaded_by", sa.String(128), nullable=True)),
        (
            "artifacts",
            sa.Column("trusted", sa.Boolean(), nullable=False, server_default=sa.false()),
        ),
        ("artifacts", sa.Column("item_digest", sa.String(64), nullable=True)),
    ]


# Each index as the current migrations leave it: name, table, columns.
_INDEXES: tuple[tuple[str, str, list[str]], ...] = (
    ("ix_winners_record_id", "winners", ["record_id"]),
    ("ix_artifacts_name", "artifacts", ["namespace", "partition", "key"]),
    ("ix_artifacts_item", "artifacts", ["item_digest"]),
    ("ix_artifacts_order", "artifacts", ["namespace", "partition", "id"]),
)


def _fill_item_digests(bind: sa.Connection) -> None:
    """Gives every copy its item's digest, as 0015 does (namespace, partition, key, item)."""
    from tunecache.canonical import digest

    artifacts = sa.table(
        "artifacts", sa.column("id", sa.Integer), sa.column("namespace", sa.String),
        sa.column("partition", sa.String), sa.column("key", sa.String),
        sa.column("item", sa.String), sa.column("item_digest", sa.String),
    )  # fmt: skip
    a = artifacts.c
    fill = artifacts.update().where(a.id == sa.bindparam("row_id"))
    fill = fill.values(item_digest=sa.bindparam("shared"))
    after = 0
    while batch := bind.execute(
        sa.select(a.id, a.namespace, a.partition, a.key, a.item)
        .where(a.id > after).order_by(a.id).limit(_BATCH)
    ).all():  # fmt: skip
        bind.execute(fill, [{"row_id": i, "shared": digest([ns, part, key, item])}
                            for i, ns, part, key, item in batch])  # fmt: skip
        after = batch[-1][0]


def upgrade() -> None:
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    columns = {t: {c["name"] for c in inspector.get_columns(t)}
               for t in ("jobs", "records", "artifacts")}  # fmt: skip
    for table, column in _columns():
        if column.name not in columns[table]:
            op.add_column(table, column)
    if "item_digest" not in columns["artifacts"]:
        _fill_item_digests(bind)
    for name, table, wanted in _INDEXES:
        held = {i["name"]: i["column_names"] for i in inspector.get_indexes(table)}
        if held.get(name) == wanted:
            continue
        if name in held:  # 0015's first version: ix_artifacts_item on the item's columns
            op.drop_index(name, table_name=table)
        op.create_index(name, table, wanted)


def downgrade() -> None:
    """Nothing: what upgrade added, the current versions of 0004-0015 add, and drop."""
