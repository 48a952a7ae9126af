"""Trust: records' status and disputes; going back deletes the rejected and disputed records.

A record's status (pending, verified, disputed, rejected), who uploaded it, consumers' disputes,
verifiers' leases and findings, the verified policy's winners, trusted tokens.

Existing records become ``pending``. A stored record whose config the closed schemas of
:mod:`tunecache.configcheck` refuse (a MetaSchedule trace that links code, a Triton value outside
a built-in kernel's space) becomes ``rejected`` and loses its place as winner, which goes to the
key's fastest record still servable, if any; a stored artifact they refuse is deleted. Artifacts
remember who uploaded them and whether that token was trusted (the ``verified`` policy serves
only trusted tokens' artifacts).

Going back deletes the records a verifier rejected or a consumer disputed, with their trials: a
revision without a status would serve them, and upgrading again would make them ``pending``. A
key whose winner one of them was gets its fastest validated record left, if any.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _reject_unservable(bind: sa.Connection) -> None:
    from tunecache.configcheck import config_problem

    records = sa.table(
        "records", sa.column("id", sa.Integer), sa.column("key_hash", sa.String),
        sa.column("key", sa.JSON), sa.column("config", sa.JSON), sa.column("time_ms", sa.Float),
        sa.column("validated", sa.Boolean), sa.column("status", sa.String),
    )  # fmt: skip
    winners = sa.table(
        "winners", sa.column("key_hash", sa.String), sa.column("record_id", sa.Integer),
        sa.column("time_ms", sa.Float), sa.column("updated_at", sa.DateTime(timezone=True)),
    )  # fmt: skip
    rows = bind.execute(sa.select(records.c.id, records.c.key_hash, records.c.key,
                                  records.c.config)).all()  # fmt: skip
    touched: set[str] = set()
    for row_id, key_hash, stored_key, config in rows:
        key: dict[str, Any] = stored_key if isinstance(stored_key, dict) else {}
        device = key.get("device")
        kind = str(device.get("kind", "cpu")) if isinstance(device, dict) else "cpu"
        if config_problem(str(key.get("backend")), config, kernel=key.get("kernel"),
                          device=kind) is None:  # fmt: skip
            continue
        bind.execute(records.update().where(records.c.id == row_id).values(status="rejected"))
        bind.execute(winners.delete().where(winners.c.record_id == row_id))
        touched.add(key_hash)
    for key_hash in sorted(touched):
        best = bind.execute(
            sa.select(records.c.id, records.c.time_ms)
            .where(
                records.c.key_hash == key_hash,
                records.c.validated.is_(True),
                records.c.status == "pending",
            )
            .order_by(records.c.time_ms, records.c.id)
            .limit(1)
        ).first()
        held = bind.execute(sa.select(winners.c.record_id).where(winners.c.key_hash == key_hash))
        if best is not None and held.first() is None:
            values = {"key_hash": key_hash, "record_id": best[0], "time_ms": best[1]}
            bind.execute(winners.insert().values(**values, updated_at=sa.func.now()))


def _drop_unservable_artifacts(bind: sa.Connection) -> None:
    """Deletes stored artifacts the closed schemas refuse (a MetaSchedule trace that links code):
    clients older than those schemas would use them."""
    from tunecache.configcheck import artifact_problem

    artifacts = sa.table(
        "artifacts", sa.column("id", sa.Integer), sa.column("namespace", sa.String),
        sa.column("value", sa.JSON),
    )  # fmt: skip
    rows = bind.execute(sa.select(artifacts.c.id, artifacts.c.namespace, artifacts.c.value))
    refused = [i for i, namespace, value in rows if artifact_problem(namespace, value) is not None]
    for start in range(0, len(refused), 500):
        bind.execute(artifacts.delete().where(artifacts.c.id.in_(refused[start : start + 500])))


def upgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("status", sa.String(16), nullable=False,
                                   server_default="pending"))  # fmt: skip
        batch.add_column(sa.Column("uploaded_by", sa.String(128), nullable=True))
        batch.add_column(sa.Column("verification", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("disputes", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("verify_owner", sa.String(128), nullable=True))
        batch.add_column(sa.Column("verify_expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("verify_attempts", sa.Integer(), nullable=False,
                                   server_default="0"))  # fmt: skip
        batch.add_column(sa.Column("verify_claimed_at", sa.DateTime(timezone=True),
                                   nullable=True))  # fmt: skip
    op.create_index("ix_records_verify_queue", "records", ["status", "device_arch", "backend"])
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("trusted", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))  # fmt: skip
    with op.batch_alter_table("artifacts") as batch:
        batch.add_column(sa.Column("uploaded_by", sa.String(128), nullable=True))
        batch.add_column(sa.Column("trusted", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))  # fmt: skip
    op.create_table(
        "verified_winners",
        sa.Column("key_hash", sa.String(64), primary_key=True),
        sa.Column(
            "record_id",
            sa.Integer(),
            sa.ForeignKey("records.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("time_ms", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_verified_winners_record_id", "verified_winners", ["record_id"])
    op.create_table(
        "disputes",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "record_id",
            sa.Integer(),
            sa.ForeignKey("records.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("reporter", sa.String(128), nullable=False),
        sa.Column("problem", sa.JSON(), nullable=False),
        sa.Column("check", sa.JSON(), nullable=False),
        sa.Column("device", sa.JSON(), nullable=True),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_disputes_record_id", "disputes", ["record_id"])
    _reject_unservable(op.get_bind())
    _drop_unservable_artifacts(op.get_bind())


def _delete_untrusted(bind: sa.Connection) -> None:
    """Deletes the rejected and disputed records (their trials, disputes, winner rows; a job
    they answered keeps no record), and gives each key whose winner one was its fastest
    validated record left, as :func:`cache_server.trust.recompute_winners` would."""
    records = sa.table(
        "records", sa.column("id", sa.Integer), sa.column("key_hash", sa.String),
        sa.column("time_ms", sa.Float), sa.column("validated", sa.Boolean),
        sa.column("status", sa.String),
    )  # fmt: skip
    winners = sa.table(
        "winners", sa.column("key_hash", sa.String), sa.column("record_id", sa.Integer),
        sa.column("time_ms", sa.Float), sa.column("updated_at", sa.DateTime(timezone=True)),
    )  # fmt: skip
    doomed = sa.select(records.c.id).where(records.c.status.in_(("rejected", "disputed")))
    touched = bind.execute(sa.select(winners.c.key_hash).where(winners.c.record_id.in_(doomed)))
    keys = sorted(touched.scalars())
    for name in ("trials", "disputes", "verified_winners", "winners"):
        table = sa.table(name, sa.column("record_id", sa.Integer))
        bind.execute(table.delete().where(table.c.record_id.in_(doomed)))
    jobs = sa.table("jobs", sa.column("record_id", sa.Integer))
    bind.execute(jobs.update().where(jobs.c.record_id.in_(doomed)).values(record_id=None))
    bind.execute(records.delete().where(records.c.id.in_(doomed)))
    for key_hash in keys:
        best = bind.execute(
            sa.select(records.c.id, records.c.time_ms)
            .where(records.c.key_hash == key_hash, records.c.validated.is_(True))
            .order_by(records.c.time_ms, records.c.id).limit(1)
        ).first()  # fmt: skip
        if best is not None:
            values = {"key_hash": key_hash, "record_id": best[0], "time_ms": best[1]}
            bind.execute(winners.insert().values(**values, updated_at=sa.func.now()))


def downgrade() -> None:
    _delete_untrusted(op.get_bind())
    op.drop_index("ix_disputes_record_id", table_name="disputes")
    op.drop_table("disputes")
    op.drop_index("ix_verified_winners_record_id", table_name="verified_winners")
    op.drop_table("verified_winners")
    # Column by column, not in batch mode: SQLite's batch mode copies a table and drops the old
    # one, and with foreign keys on, dropping ``records`` deleted every winner and trial. SQLite
    # >= 3.35 drops a column in place.
    for column in ("trusted", "uploaded_by"):
        op.drop_column("artifacts", column)
    op.drop_column("tokens", "trusted")
    op.drop_index("ix_records_verify_queue", table_name="records")
    for column in ("verify_claimed_at", "verify_attempts", "verify_expires_at", "verify_owner",
                   "disputes", "verification", "uploaded_by", "status"):  # fmt: skip
        op.drop_column("records", column)
