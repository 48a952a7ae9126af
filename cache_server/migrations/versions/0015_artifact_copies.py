"""Each token keeps its own copy of an artifact: an item was one row, which another token's upload
with a made-up score replaced in place (the teammate's honest value was not kept), and revoking
that token left its value in service. A copy's digest now names the token too, and a read
serves the best live copy (cache_server.artifacts): found by the item's digest (the copies'
shared name, indexed), and pages read by id within a partition without sorting it.

Items stored before are given the token of their uploader's name where exactly one token has that
name (a name is not unique); the others keep no token, and stay served as before (so do all
items of a database whose 0007 was its first version, which recorded no uploader).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_BATCH = 1000
_artifacts = sa.table(
    "artifacts", sa.column("id", sa.Integer), sa.column("digest", sa.String),
    sa.column("namespace", sa.String), sa.column("partition", sa.String),
    sa.column("key", sa.String), sa.column("item", sa.String), sa.column("score", sa.Float),
    sa.column("item_digest", sa.String),
    sa.column("trusted", sa.Boolean), sa.column("uploaded_by", sa.String),
    sa.column("token_id", sa.Integer),
)  # fmt: skip
_tokens = sa.table("tokens", sa.column("id", sa.Integer), sa.column("name", sa.String),
                   sa.column("revoked_at", sa.DateTime(timezone=True)))  # fmt: skip


def _redigest(bind: sa.Connection, *, with_token: bool) -> None:
    """Names every copy as cache_server.artifacts.artifact_digest does, with its token
    (``with_token``: and gives each its item's digest), or without it as before this revision."""
    from tunecache.canonical import digest

    a = _artifacts.c
    fill = _artifacts.update().where(a.id == sa.bindparam("row_id"))
    fill = fill.values(digest=sa.bindparam("copy"), **(
        {"item_digest": sa.bindparam("shared")} if with_token else {}))  # fmt: skip
    after = 0
    while batch := bind.execute(
        sa.select(a.id, a.namespace, a.partition, a.key, a.item, a.token_id)
        .where(a.id > after).order_by(a.id).limit(_BATCH)
    ).all():  # fmt: skip
        named = [(i, [ns, part, key, item], token) for i, ns, part, key, item, token in batch]
        bind.execute(fill, [
            {"row_id": i, "shared": digest(item),
             "copy": digest(item if token is None or not with_token else [*item, token])}
            for i, item, token in named])  # fmt: skip
        after = batch[-1][0]


def upgrade() -> None:
    op.add_column("artifacts", sa.Column("token_id", sa.Integer, nullable=True))
    op.add_column("artifacts", sa.Column("item_digest", sa.String(64), nullable=True))
    bind = op.get_bind()
    t = _tokens.c
    sole = (
        sa.select(sa.func.min(t.id)).where(t.name == _artifacts.c.uploaded_by)
        .having(sa.func.count() == 1).scalar_subquery()
    )  # fmt: skip
    # 0007's first version recorded no uploader: its items keep no token (0018 adds the column).
    if any(c["name"] == "uploaded_by" for c in sa.inspect(bind).get_columns("artifacts")):
        bind.execute(_artifacts.update().values(token_id=sole))
    _redigest(bind, with_token=True)
    op.create_index("ix_artifacts_item", "artifacts", ["item_digest"])
    op.create_index("ix_artifacts_order", "artifacts", ["namespace", "partition", "id"])


def downgrade() -> None:
    """Back to one row per item: the one a read served (a revoked token's copy only where no
    other is left), named as before."""
    bind = op.get_bind()
    a, t = _artifacts.c, _tokens.c
    rank = sa.func.row_number().over(
        partition_by=[a.namespace, a.partition, a.key, a.item],
        order_by=[t.revoked_at.is_(None).desc(), a.trusted.desc(), a.score.is_(None), a.score,
                  a.id],
    )  # fmt: skip
    ranked = (
        sa.select(a.id, rank.label("rank"))
        .select_from(_artifacts.outerjoin(_tokens, t.id == a.token_id)).subquery()
    )  # fmt: skip
    losers = sa.select(ranked.c.id).where(ranked.c.rank > 1)
    bind.execute(_artifacts.delete().where(a.id.in_(losers)))
    _redigest(bind, with_token=False)
    op.drop_index("ix_artifacts_order", table_name="artifacts")
    op.drop_index("ix_artifacts_item", table_name="artifacts")
    # Not a batch (see 0012): SQLite >= 3.35 drops a column in place.
    op.drop_column("artifacts", "item_digest")
    op.drop_column("artifacts", "token_id")
