"""A user's kernel's records indexed by their problem's widest bucket (every size rounded up to
a power of two), not at their exact shape: a server never imports a user's kernel, so it cannot
know its bucket, and a lookup that rounds by the caller's kernel (``LookupRequest.bucket``)
found no bucket mate. The widest bucket holds the mates of whatever dimensions a caller rounds.
A built-in kernel's records keep the index of its bucket.

The hashes are computed here as they were and are, the built-in kernels named as they were at
this revision (a migration must not change with the code).

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

BUILTIN = ("matmul", "softmax", "layernorm", "rmsnorm", "bias_gelu")
_BATCH = 1000
_SAME = ("kernel", "source_hash", "backend", "dtype")


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _digest(key: dict[str, Any], widest: bool) -> str:
    from tunecache.canonical import digest

    problem = key["problem"]
    bucket = {k: _pow2(v) if widest and type(v) is int else v for k, v in sorted(problem.items())}
    shared = {f: key[f] for f in _SAME}
    return digest({**shared, "arch": key["device"]["arch"], "bucket": bucket})


def _rehash(digest: Callable[[dict[str, Any]], str]) -> None:
    """Re-hashes the records of every kernel not built-in, a batch at a time."""
    records = sa.table(
        "records", sa.column("id", sa.Integer), sa.column("kernel", sa.String),
        sa.column("key", sa.JSON), sa.column("bucket_hash", sa.String),
    )  # fmt: skip
    update = (
        records.update()
        .where(records.c.id == sa.bindparam("row_id"))
        .values(bucket_hash=sa.bindparam("hash"))
    )
    bind = op.get_bind()
    after = 0
    while rows := bind.execute(
        sa.select(records.c.id, records.c.key)
        .where(records.c.id > after, records.c.kernel.not_in(BUILTIN))
        .order_by(records.c.id).limit(_BATCH)
    ).all():  # fmt: skip
        bind.execute(update, [{"row_id": row_id, "hash": digest(key)} for row_id, key in rows])
        after = rows[-1][0]


def upgrade() -> None:
    _rehash(lambda key: _digest(key, widest=True))


def downgrade() -> None:
    _rehash(lambda key: _digest(key, widest=False))  # as a server knowing no user's kernel
