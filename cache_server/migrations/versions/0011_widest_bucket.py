"""Records indexed by their problem's widest bucket (every size rounded up to a power of two),
not by their kernel's bucket as this server registered it: a server never imports a user's
kernel, so a user's kernel's records were indexed at their exact shapes, and a lookup that rounds
by the caller's kernel (``LookupRequest.bucket``) could not find its bucket mates.

The hashes are computed here as they were and are (a migration must not change with the code).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_BATCH = 1000
_SAME = ("kernel", "source_hash", "backend", "dtype")


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _digest(key: dict[str, Any], rounded: Callable[[str, Any], bool]) -> str:
    from tunecache.canonical import digest

    bucket = {k: _pow2(v) if rounded(k, v) else v for k, v in sorted(key["problem"].items())}
    shared = {f: key[f] for f in _SAME}
    return digest({**shared, "arch": key["device"]["arch"], "bucket": bucket})


def _widest(key: dict[str, Any]) -> str:
    return _digest(key, lambda _, v: type(v) is int)


def _registered(key: dict[str, Any]) -> str:
    from tunecache.policies import bucket_policy

    dims = bucket_policy(key["kernel"]).dims
    return _digest(key, lambda k, v: k in dims and isinstance(v, int))


def _rehash(digest: Callable[[dict[str, Any]], str]) -> None:
    records = sa.table(
        "records", sa.column("id", sa.Integer), sa.column("key", sa.JSON),
        sa.column("bucket_hash", sa.String),
    )  # fmt: skip
    bind = op.get_bind()
    after = 0
    while rows := bind.execute(
        sa.select(records.c.id, records.c.key).where(records.c.id > after)
        .order_by(records.c.id).limit(_BATCH)
    ).all():  # fmt: skip
        for row_id, key in rows:
            bind.execute(
                records.update().where(records.c.id == row_id).values(bucket_hash=digest(key))
            )
        after = rows[-1][0]


def upgrade() -> None:
    _rehash(_widest)


def downgrade() -> None:
    _rehash(_registered)
