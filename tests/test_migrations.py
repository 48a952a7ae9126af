"""Schema management: Alembic creates the schema; the server refuses a database not at head."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cache_server import SchemaOutdated
from cache_server.db import make_engine
from cache_server.embedded import free_port
from cache_server.migrate import check_schema, current_revision, head_revision, upgrade


def test_upgrade_creates_every_table(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    upgrade(url)
    engine = make_engine(url)
    assert current_revision(engine) == head_revision()
    check_schema(engine)  # does not raise
    with sqlite3.connect(tmp_path / "new.db") as db:
        tables = {r[0] for r in db.execute("select name from sqlite_master where type='table'")}
        mode = db.execute("pragma journal_mode").fetchone()[0]
    assert {"records", "trials", "winners", "alembic_version"} <= tables
    assert mode == "wal"


def test_empty_database_is_refused_with_the_upgrade_command(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(SchemaOutdated, match="tunecache db upgrade --db sqlite:///"):
        check_schema(engine)


def test_unknown_revision_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url)
    with sqlite3.connect(tmp_path / "old.db") as db:
        db.execute("update alembic_version set version_num = '0000'")
    with pytest.raises(SchemaOutdated, match="revision 0000"):
        check_schema(make_engine(url))


def test_serve_refuses_an_empty_database_when_told_not_to_create(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    port = str(free_port())  # one this user may bind: the port is checked first
    done = subprocess.run(
        [sys.executable, "-m", "tunecache_cli", "serve", "--db", url, "--no-create", "--port", port],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "tunecache db upgrade" in done.stderr and "Traceback" not in done.stderr
    # A database that is not there is said so, and none is left behind (an empty file was).
    assert "there is no database at" in done.stderr and not (tmp_path / "empty.db").exists()
    sqlite3.connect(tmp_path / "empty.db").close()  # there, but with no schema
    done = subprocess.run(
        [sys.executable, "-m", "tunecache_cli", "serve", "--db", url, "--no-create", "--port", port],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "has no tunecache schema" in done.stderr, done.stderr


def test_db_upgrade_command(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    done = subprocess.run(
        [sys.executable, "-m", "tunecache_cli", "db", "upgrade", "--db", url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert current_revision(make_engine(url)) == head_revision()


def test_plain_postgresql_urls_use_psycopg_3() -> None:
    from cache_server.settings import ServerSettings

    settings = ServerSettings(db="postgresql://u:p@host/db")
    assert settings.db == "postgresql+psycopg://u:p@host/db"
    with pytest.raises(ValueError, match="must be sqlite"):
        ServerSettings(db="mysql://host/db")


@pytest.mark.slow
def test_upgrade_from_the_first_revision_keeps_the_data(database: tuple[str, Path | None]) -> None:
    from sqlalchemy import inspect

    from cache_server.db import make_engine, make_sessionmaker
    from cache_server.lookup import find_winner
    from cache_server.queries import get_winner
    from tests.factories import make_key, make_record
    from tunecache.schemas import KeyModel

    url, _ = database
    upgrade(url, "0001")
    engine = make_engine(url)
    assert current_revision(engine) == "0001"
    assert "jobs" not in inspect(engine).get_table_names()
    with pytest.raises(SchemaOutdated, match="revision 0001"):
        check_schema(engine)
    key = make_key()
    _store_as_at_0001(engine, key, make_record(key, time_ms=0.5))
    upgrade(url)
    engine = make_engine(url)
    check_schema(engine)
    assert "jobs" in inspect(engine).get_table_names()
    with make_sessionmaker(engine)() as session:
        record = get_winner(session, key_hash=key.digest())
        # 0004 backfilled the bucket index: a nearby shape finds the old record by its bucket.
        near = find_winner(session, key=KeyModel.from_key(make_key(m=50)))
    assert record is not None and record.timing.median_ms == 0.5
    assert near is not None and near[1] == "bucket" and near[0].id == record.id


def _store_as_at_0001(engine: Any, key: Any, record: Any, *, winner: bool = True) -> None:
    """A record and its winner written with the columns the database has (revision 0001's, or
    a later revision's)."""
    from sqlalchemy import MetaData, Table, insert

    from cache_server.models import utcnow
    from cache_server.queries import record_row

    meta = MetaData()
    records = Table("records", meta, autoload_with=engine)
    winners = Table("winners", meta, autoload_with=engine)
    row = record_row(key_hash=key.digest(), record=record)
    values = {c.name: getattr(row, c.name) for c in records.columns if c.name != "id"}
    with engine.begin() as connection:
        record_id = connection.execute(
            insert(records).values(**{**values, "created_at": utcnow()})
        ).inserted_primary_key[0]
        if not winner:
            return
        connection.execute(insert(winners).values(key_hash=key.digest(), record_id=record_id,
                                                  time_ms=0.5, updated_at=utcnow()))  # fmt: skip


@pytest.mark.slow
def test_records_stored_before_the_upload_digest_stay_and_the_migration_goes_back(
    database: tuple[str, Path | None],
) -> None:
    """0012 gives new records what makes an upload the same one; a record stored before has none
    (sent again, it is stored anew, once); downgrading keeps every record."""
    from alembic import command
    from sqlalchemy import text

    from cache_server.db import make_sessionmaker
    from cache_server.migrate import alembic_config
    from cache_server.queries import add_record
    from tests.factories import make_key, make_record

    url, _ = database
    upgrade(url, "0011")
    key = make_key()
    record = make_record(key, time_ms=0.5)
    _store_as_at_0001(make_engine(url), key, record)  # with the columns 0011 has
    upgrade(url)
    with make_sessionmaker(make_engine(url))() as session:
        anew = add_record(session, key_hash=key.digest(), record=record)
        again = add_record(session, key_hash=key.digest(), record=record)
        session.commit()
    assert not anew.again and again.again and again.record_id == anew.record_id
    command.downgrade(alembic_config(url), "0011")
    with make_engine(url).connect() as connection:
        assert connection.execute(text("select count(*) from records")).scalar_one() == 2
    upgrade(url)
    check_schema(make_engine(url))


@pytest.mark.slow
def test_records_stored_before_the_config_digest_get_theirs_and_share_findings(
    database: tuple[str, Path | None],
) -> None:
    """0013 gives every record stored before its config's digest: a dispute of one then reaches
    its copies stored before the migration too."""
    from alembic import command
    from sqlalchemy import text

    from cache_server.db import make_sessionmaker
    from cache_server.migrate import alembic_config
    from cache_server.trust import add_dispute
    from cache_server.twins import config_digest
    from tests.factories import knobs, make_key, make_record
    from tunecache.verification import DisputeCreate

    url, _ = database
    upgrade(url, "0012")
    key = make_key()
    records = [make_record(key, time_ms=ms, config=knobs(1)) for ms in (0.5, 0.7)]
    for i, record in enumerate(records):  # with the columns 0012 has
        _store_as_at_0001(make_engine(url), key, record, winner=i == 0)
    upgrade(url)
    with make_engine(url).connect() as connection:
        stored = connection.execute(text("select id, config_digest from records")).all()
    assert [d for _, d in stored] == [config_digest("tvm", knobs(1), kernel=key.kernel)] * 2
    check = records[0].validation.checks[0].model_copy(update={"passed": False})
    with make_sessionmaker(make_engine(url))() as session:
        add_dispute(session, record_id=stored[0][0], reporter="r",
                    dispute=DisputeCreate(problem=dict(key.problem), check=check))  # fmt: skip
        session.commit()
    with make_engine(url).connect() as connection:
        statuses = connection.execute(text("select status from records")).scalars().all()
    assert statuses == ["disputed", "disputed"]
    command.downgrade(alembic_config(url), "0012")
    upgrade(url)
    check_schema(make_engine(url))


@pytest.mark.slow
def test_downgrading_to_the_first_revision_keeps_every_record_winner_and_trial(
    database: tuple[str, Path | None],
) -> None:
    """Each downgrade keeps the data it does not drop. 0007's went through SQLite's batch mode,
    which copies ``records`` and drops the old table: with foreign keys on, every winner and
    trial went with it."""
    from alembic import command
    from alembic.script import ScriptDirectory
    from sqlalchemy import text

    from cache_server.db import make_sessionmaker
    from cache_server.migrate import alembic_config
    from cache_server.queries import add_record
    from tests.factories import make_key, make_record

    url, _ = database
    upgrade(url)
    with make_sessionmaker(make_engine(url))() as session:
        key = make_key()
        add_record(session, key_hash=key.digest(), record=make_record(key, trials=3))
        session.commit()
    config = alembic_config(url)
    for script in ScriptDirectory.from_config(config).walk_revisions("0002", "head"):
        command.downgrade(config, script.down_revision)
        with make_engine(url).connect() as connection:
            held = [connection.execute(text(f"select count(*) from {table}")).scalar_one()
                    for table in ("records", "winners", "trials")]  # fmt: skip
        assert held == [1, 1, 3], f"after downgrading {script.revision}"


def test_the_migrations_build_exactly_the_models(database: tuple[str, Path | None]) -> None:
    """Alembic's autogenerate finds nothing to add: the models and the migrations agree."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from cache_server.models import Base

    url, _ = database
    upgrade(url)
    with make_engine(url).connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert differences == []


def test_the_trust_migration_rejects_stored_records_the_closed_schemas_refuse(
    tmp_path: Path,
) -> None:
    """A database from before the closed schemas may hold a record no client may use as a key's
    winner: upgrading marks it rejected and hands the winner to the next servable record."""
    from datetime import UTC, datetime

    import sqlalchemy as sa

    from tests.factories import make_key, make_record
    from tunecache.rules import bucket_digest

    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url, "0006")
    key = make_key(m=64, backend="triton")
    alone = make_key(m=4096, backend="triton")
    good = make_record(key, time_ms=2.0).model_dump(mode="json", by_alias=True)
    bad = {**good, "config": {**good["config"], "GROUP_M": 0}}  # not in matmul's space
    engine = make_engine(url)
    records = sa.Table("records", sa.MetaData(), autoload_with=engine)
    winners = sa.Table("winners", sa.MetaData(), autoload_with=engine)
    with engine.begin() as conn:
        ids = []
        for record, the_key, ms in ((bad, key, 1.0), (good, key, 2.0), (bad, alone, 1.0)):
            row = conn.execute(records.insert().values(
                key_hash=the_key.digest(), kernel="matmul", backend="triton", dtype="float32",
                device_arch="cpu-avx2", device_name="test-cpu", key=the_key.to_json(),
                config=record["config"], config_summary="", time_ms=ms, timing=record["timing"],
                baselines=[], validated=True, max_rel_error=1e-6, validation=record["validation"],
                search=record["search"], provenance={}, trial_count=0,
                created_at=datetime.now(UTC), bucket_hash=bucket_digest(the_key.to_json()),
            ))  # fmt: skip
            ids.append(row.inserted_primary_key[0])
        now = datetime.now(UTC)
        conn.execute(winners.insert(), [
            {"key_hash": key.digest(), "record_id": ids[0], "time_ms": 1.0, "updated_at": now},
            {"key_hash": alone.digest(), "record_id": ids[2], "time_ms": 1.0, "updated_at": now},
        ])  # fmt: skip
    artifacts = sa.Table("artifacts", sa.MetaData(), autoload_with=engine)
    code = [[[["Annotate", ["l0", '"declare i32 @system(ptr)"'], ["pragma_import_llvm"], []]],
             []], [1e-3], {"kind": "llvm"}, []]  # fmt: skip
    group = {"op": "mm", "inputs": "[x]", "precision": "highest", "timings": {"c": 1.0}}
    with engine.begin() as conn:
        for name, namespace, value in (("code", "tvm.record", code),
                                       ("group", "inductor.choices", group)):  # fmt: skip
            conn.execute(artifacts.insert().values(
                digest=name, namespace=namespace, partition="p", key=name, item="", value=value,
                score=1.0, updated_at=datetime.now(UTC),
            ))  # fmt: skip
    upgrade(url)
    with sqlite3.connect(tmp_path / "old.db") as db:
        statuses = dict(db.execute("select id, status from records").fetchall())
        held = dict(db.execute("select key_hash, record_id from winners").fetchall())
        kept = [r[0] for r in db.execute("select key from artifacts")]
    assert statuses == {ids[0]: "rejected", ids[1]: "pending", ids[2]: "rejected"}
    assert held == {key.digest(): ids[1]}  # the servable record; the other key has none
    assert kept == ["group"]  # the code-bearing MetaSchedule record is gone


def test_the_kernel_module_migration_fills_in_the_jobs_queued_before_it(tmp_path: Path) -> None:
    """Jobs queued at 0007 get their kernel's module (a user's kernel) or none (a built-in), so
    a daemon's claim filters them like new ones; downgrading drops the column again."""
    from alembic import command

    from cache_server.migrate import alembic_config
    from tests.factories import make_key, queue_at

    url = f"sqlite:///{tmp_path / 'old.db'}"
    queue_at(url, "0007", {str(m) * 4: ({**make_key(m=m).to_json(), "kernel": kernel}, "tvm")
                           for m, kernel in ((8, "matmul"), (16, "mypkg.kernels:Affine"))})  # fmt: skip
    upgrade(url)
    with sqlite3.connect(tmp_path / "old.db") as db:
        modules = dict(db.execute("select key_hash, kernel_module from jobs").fetchall())
    assert modules == {"8888": None, "16161616": "mypkg.kernels"}
    command.downgrade(alembic_config(url), "0007")
    with sqlite3.connect(tmp_path / "old.db") as db:
        columns = {row[1] for row in db.execute("pragma table_info(jobs)")}
    assert "kernel_module" not in columns and "device_arch" in columns


def test_the_job_callers_migration_adds_the_lease_token_and_the_requester(tmp_path: Path) -> None:
    """A job leased at 0008 was claimed by no token the server knew (NULL: only an admin token
    may end that lease), and one queued by a miss counts towards no caller's share (NULL);
    downgrading drops both columns and the index again."""
    from datetime import UTC, datetime, timedelta

    import sqlalchemy as sa
    from alembic import command

    from cache_server.migrate import alembic_config
    from tests.factories import make_key

    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url, "0008")
    jobs = sa.Table("jobs", sa.MetaData(), autoload_with=make_engine(url))
    now = datetime.now(UTC)
    with make_engine(url).begin() as conn:
        conn.execute(jobs.insert().values(
            key_hash="ab" * 32, key=make_key().to_json(), state="running", priority=0,
            source="miss", attempts=1, max_attempts=3, error="", created_at=now, updated_at=now,
            backend="tvm", device_arch="cpu-avx2", lease_owner="w",
            lease_expires_at=now + timedelta(minutes=5),
        ))  # fmt: skip
    upgrade(url)
    with sqlite3.connect(tmp_path / "old.db") as db:
        rows = db.execute("select lease_owner, lease_token_id, requested_by from jobs").fetchall()
        indexes = {row[1] for row in db.execute("pragma index_list(jobs)")}
    assert rows == [("w", None, None)]
    assert "ix_jobs_requested_by" in indexes
    command.downgrade(alembic_config(url), "0008")
    with sqlite3.connect(tmp_path / "old.db") as db:
        columns = {row[1] for row in db.execute("pragma table_info(jobs)")}
        indexes = {row[1] for row in db.execute("pragma index_list(jobs)")}
    assert not {"lease_token_id", "requested_by"} & columns and "lease_owner" in columns
    assert "ix_jobs_requested_by" not in indexes


def test_reopening_a_keys_jobs_reads_them_by_record_not_every_done_job(tmp_path: Path) -> None:
    """``jobs.reopen`` runs when a verifier rejects a key's last servable record: its jobs are
    found through the index of answered jobs, not by reading every done job ever kept (SQLite's
    plan for the very statement it runs)."""
    from sqlalchemy import event

    from cache_server import jobs
    from cache_server.db import make_sessionmaker

    url = f"sqlite:///{tmp_path / 'plan.db'}"
    upgrade(url)
    engine = make_engine(url)
    sent: list[tuple[str, Any]] = []

    @event.listens_for(engine, "before_cursor_execute")
    def keep(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE JOBS"):
            sent.append((statement, params))

    with make_sessionmaker(engine)() as session:
        assert jobs.reopen(session, key_hash="ab" * 32, error="rejected") == 0
    [(statement, params)] = sent
    with engine.connect() as conn:
        plan = " ".join(row[3] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}",
                                                               params))  # fmt: skip
    assert "ix_jobs_answered" in plan and "SCAN jobs" not in plan, plan


@pytest.mark.slow
def test_the_widest_bucket_migration_indexes_a_users_kernel_for_its_callers_bucket(
    database: tuple[str, Path | None],
) -> None:
    """Before 0011 a user's kernel's records were indexed at their exact shape (the server does
    not know its bucket), so a caller rounding ``M`` found no bucket mate; 0011 indexes every
    record by its widest bucket, and downgrading puts the old index back."""
    from alembic import command
    from sqlalchemy import text

    from cache_server.db import make_sessionmaker
    from cache_server.lookup import find_winner
    from cache_server.migrate import alembic_config
    from cache_server.queries import add_record
    from tests.factories import CPU, make_key, make_record
    from tunecache.key import Key
    from tunecache.rules import bucket_digest
    from tunecache.schemas import KeyModel

    def affine(m: int) -> Key:
        return Key(kernel="mypkg.kernels:Affine", source_hash="abcd", backend="tvm",
                   problem={"M": m, "N": 64}, dtype="float32", device=CPU,
                   environment={"apache-tvm": "0.27.0"})  # fmt: skip

    def near(wanted: Key) -> Any:
        with make_sessionmaker(make_engine(url))() as session:
            found = find_winner(session, key=KeyModel.from_key(wanted), bucket=["M"])
        return None if found is None else (found[0].id, found[1])

    url, _ = database
    upgrade(url)
    with make_sessionmaker(make_engine(url))() as session:
        tuned = add_record(session, key_hash=affine(100).digest(), record=make_record(affine(100)))
        built_in = add_record(session, key_hash=make_key(m=100).digest(),
                              record=make_record(make_key(m=100)))  # fmt: skip
        session.commit()

    def indexed_with(added: Any, wanted: Key) -> bool:
        """Whether the record is indexed where a lookup of ``wanted`` reads (by SQL: the models
        are at head, the schema at 0010)."""
        with make_engine(url).connect() as connection:
            stored = connection.execute(text("select bucket_hash from records where id = :id"),
                                        {"id": added.record_id}).scalar_one()  # fmt: skip
        return stored == bucket_digest(
            KeyModel.from_key(wanted).model_dump(mode="json", by_alias=True)
        )

    assert near(affine(120)) == (tuned.record_id, "bucket")
    command.downgrade(alembic_config(url), "0010")
    assert not indexed_with(tuned, affine(120))  # indexed at its exact shape, as before
    assert indexed_with(built_in, make_key(m=120))  # a built-in's: left alone
    upgrade(url)
    assert near(affine(120)) == (tuned.record_id, "bucket")
    assert near(make_key(m=120)) == (built_in.record_id, "bucket")


@pytest.mark.slow
def test_artifacts_stored_before_copies_per_token_keep_their_uploader_where_the_name_is_sole(
    database: tuple[str, Path | None],
) -> None:
    """0015: an item stored before is given its uploader's token where one token has that name
    (later uploads of that token replace it in place; revoking the token takes it out of
    service), and none where the name is shared or missing (served as before). Going back keeps
    one row per item, the one a read served."""
    from alembic import command
    from sqlalchemy import MetaData, Table, insert, text

    from cache_server import tokens
    from cache_server.artifacts import artifact_digest, list_artifacts, put_artifacts
    from cache_server.db import make_sessionmaker
    from cache_server.migrate import alembic_config
    from cache_server.models import TokenRow, utcnow
    from tunecache.artifacts import ArtifactIn
    from tunecache.canonical import digest

    def group(tag: str) -> dict[str, Any]:
        return {"op": "mm", "inputs": f"[{tag}]", "precision": "highest", "timings": {"c": 1.0}}

    def item(name: str, tag: str, score: float) -> ArtifactIn:
        return ArtifactIn(namespace="inductor.choices", partition="p", key="k", item=name,
                          value=group(tag), score=score)  # fmt: skip

    def served() -> dict[str, str]:
        with make_sessionmaker(make_engine(url))() as session:
            got, _ = list_artifacts(session, namespace="inductor.choices", partition="p",
                                    key=None, after=None, limit=100, budget=1 << 20)  # fmt: skip
        return {a.item: str(a.value["inputs"]) for a in got}  # type: ignore[call-overload]

    url, _ = database
    upgrade(url, "0014")
    sessions = make_sessionmaker(make_engine(url))
    # As 0014 stores a token (the ORM's rows have the head's columns, which 0014 lacks)
    stored = Table("tokens", MetaData(), autoload_with=make_engine(url))

    def issue(name: str) -> int:
        row = {"name": name, "scope": "write", "prefix": "tc_test", "created_at": utcnow(),
               "secret_hash": hashlib.sha256(os.urandom(16)).hexdigest()}  # fmt: skip
        with make_engine(url).begin() as connection:
            return int(connection.execute(insert(stored).values(**row)).inserted_primary_key[0])

    alice, _, _, carol = (issue(name) for name in ("alice", "bob", "bob", "carol"))
    artifacts = Table("artifacts", MetaData(), autoload_with=make_engine(url))
    with make_engine(url).begin() as connection:
        for name, uploader in (("a", "alice"), ("b", "bob"), ("c", None)):
            connection.execute(insert(artifacts).values(
                digest=digest(["inductor.choices", "p", "k", name]), namespace="inductor.choices",
                partition="p", key="k", item=name, value=group(f"old-{name}"), score=1.0,
                updated_at=utcnow(), uploaded_by=uploader, trusted=False))  # fmt: skip
    upgrade(url)
    with make_engine(url).connect() as connection:
        owners = dict(connection.execute(text("select item, token_id from artifacts")).all())
        named = connection.execute(text("select digest from artifacts where item = 'a'"))
        assert named.scalar_one() == artifact_digest(item("a", "", 1.0), alice)
    assert owners == {"a": alice, "b": None, "c": None}
    with sessions.begin() as session:
        writer = session.get(TokenRow, alice)
        assert put_artifacts(session, items=[item("a", "alice-2", 0.5)], uploader=writer) == 1
        put_artifacts(
            session, items=[item("a", "carol", 0.1)], uploader=session.get(TokenRow, carol)
        )
    assert served() == {"a": "[carol]", "b": "[old-b]", "c": "[old-c]"}
    with sessions.begin() as session:
        tokens.revoke(session, token_id=carol)
    assert served() == {"a": "[alice-2]", "b": "[old-b]", "c": "[old-c]"}
    command.downgrade(alembic_config(url), "0014")
    with make_engine(url).connect() as connection:
        rows = connection.execute(text("select item, digest from artifacts order by item")).all()
    assert rows == [(n, digest(["inductor.choices", "p", "k", n])) for n in "abc"]
    upgrade(url)
    check_schema(make_engine(url))
    assert served() == {"a": "[alice-2]", "b": "[old-b]", "c": "[old-c]"}


def test_the_imported_by_migration_keeps_records_as_uploads_and_goes_back(tmp_path: Path) -> None:
    """0016: a record stored before was uploaded, not imported (``imported_by`` NULL, shown with
    its uploader as before); downgrading drops the column and keeps every record."""
    from alembic import command
    from sqlalchemy import text

    from cache_server.db import make_sessionmaker
    from cache_server.migrate import alembic_config
    from cache_server.models import RecordRow
    from cache_server.queries import add_record, uploader_text
    from tests.factories import make_key, make_record

    url = f"sqlite:///{tmp_path / 'cache.db'}"
    upgrade(url)
    key = make_key()
    with make_sessionmaker(make_engine(url))() as session:
        added = add_record(session, key_hash=key.digest(), record=make_record(key))
        session.commit()
    command.downgrade(alembic_config(url), "0015")
    with make_engine(url).connect() as connection:
        assert connection.execute(text("select count(*) from records")).scalar_one() == 1
    upgrade(url)
    check_schema(make_engine(url))
    with make_sessionmaker(make_engine(url))() as session:
        row = session.get(RecordRow, added.record_id)
        assert row is not None and row.imported_by is None and uploader_text(row) is None
