"""Migrations edited after their release, and what a downgrade takes out.

A database the first version of 0004, 0005, 0007 or 0015 migrated reached the head without what
their edits added (or could not upgrade at all): 0018 adds it, and the server's start-up check
compares the live columns and indexes with the models, not the revision alone. Going back below
0007 deletes the records a verifier rejected or a consumer disputed, so that none is served
again after a downgrade and an upgrade.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from cache_server import SchemaOutdated
from cache_server.db import make_engine
from cache_server.embedded import free_port
from cache_server.migrate import check_schema, downgrade, head_revision, upgrade
from tunecache.canonical import digest


def _schema(url: str) -> dict[str, Any]:
    """Every table's column names and indexes (name, columns, uniqueness), as reflected."""
    engine = make_engine(url)
    inspector = sa.inspect(engine)
    found = {}
    for table in inspector.get_table_names():
        indexes = inspector.get_indexes(table)
        found[table] = (
            sorted(c["name"] for c in inspector.get_columns(table)),
            sorted((i["name"], tuple(i["column_names"]), bool(i["unique"])) for i in indexes),
        )
    engine.dispose()
    return found


def _run(url: str, *statements: str) -> None:
    engine = make_engine(url)
    with engine.begin() as connection:
        for statement in statements:
            connection.execute(sa.text(statement))
    engine.dispose()


def _artifact(url: str, **more: Any) -> None:
    """One stored artifact, written with the columns the database has."""
    from cache_server.models import utcnow

    engine = make_engine(url)
    artifacts = sa.Table("artifacts", sa.MetaData(), autoload_with=engine)
    with engine.begin() as connection:
        connection.execute(artifacts.insert().values(
            digest=digest(["inductor.choices", "p", "k", "a"]), namespace="inductor.choices",
            partition="p", key="k", item="a", score=1.0, updated_at=utcnow(),
            value={"op": "mm", "inputs": "[a]", "precision": "highest", "timings": {"c": 1.0}},
            **more,
        ))  # fmt: skip
    engine.dispose()


# Each edited migration's first version, built by hand from the current one: its revision, and
# what the first version left out (or did otherwise) at it.
_FIRST_VERSIONS = {
    "0004": ["DROP INDEX ix_winners_record_id"],  # 8c115c7
    "0005": ["ALTER TABLE jobs DROP COLUMN strategy", "ALTER TABLE jobs DROP COLUMN trials"],
    "0007": [  # fdc7d99
        "ALTER TABLE records DROP COLUMN verify_claimed_at",
        "ALTER TABLE artifacts DROP COLUMN uploaded_by",
        "ALTER TABLE artifacts DROP COLUMN trusted",
    ],
    "0015": [  # 907adb8: the item's index on its columns, ix_artifacts_name dropped
        "DROP INDEX ix_artifacts_item",
        "DROP INDEX ix_artifacts_name",
        "ALTER TABLE artifacts DROP COLUMN item_digest",
        "CREATE INDEX ix_artifacts_item ON artifacts (namespace, partition, key, item)",
    ],
}


@pytest.mark.parametrize("first_version", sorted(_FIRST_VERSIONS))
def test_a_database_an_edited_migrations_first_version_made_is_upgraded_to_the_models(
    database: tuple[str, Path | None], first_version: str, tmp_path: Path
) -> None:
    """From 0007's first version ``db upgrade`` failed in 0015 (``artifacts.uploaded_by``);
    from the others it reached the head without the columns and indexes the edits added, and
    the server started on it and answered 500. Upgraded now, it has exactly the schema an
    empty database gets, and the server's check accepts it."""
    url, _ = database
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    if url.startswith("postgresql"):
        from tests.pg import create_database

        fresh = create_database(url.rsplit("/", 1)[0], f"{url.rsplit('/', 1)[1]}_fresh")
    upgrade(fresh)
    upgrade(url, first_version)
    _run(url, *_FIRST_VERSIONS[first_version])
    if first_version == "0007":
        _artifact(url)  # stored with no uploader: 0015 found the column missing
    elif first_version == "0015":
        _artifact(url, trusted=False, token_id=None)
    upgrade(url)
    assert _schema(url) == _schema(fresh)
    check_schema(make_engine(url))
    if first_version in ("0007", "0015"):
        with make_engine(url).connect() as connection:
            stored = connection.execute(
                sa.text("select item_digest, token_id, trusted from artifacts")
            ).one()
        assert stored == (digest(["inductor.choices", "p", "k", "a"]), None, False)


def test_a_database_at_the_head_lacking_a_column_or_index_is_refused_at_start_up(
    database: tuple[str, Path | None],
) -> None:
    """The revision alone said nothing of a column taken out: the server started and answered
    500 on every job call. Now it refuses to start naming what is missing and the commands that
    add it again; run, they do."""
    url, _ = database
    upgrade(url)
    _run(url, "ALTER TABLE jobs DROP COLUMN strategy", "DROP INDEX ix_winners_record_id")
    with pytest.raises(SchemaOutdated) as refused:
        check_schema(make_engine(url))
    said = str(refused.value)
    assert f"at revision {head_revision()} but lacks" in said, said
    assert "column jobs.strategy" in said and "index ix_winners_record_id on winners" in said
    assert "tunecache db downgrade --revision 0017 --yes --db" in said, said
    assert "tunecache db upgrade --db" in said, said
    port = str(free_port())
    served = subprocess.run(
        [sys.executable, "-m", "tunecache_cli", "serve", "--db", url, "--no-create", "--port", port],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert served.returncode == 2 and "column jobs.strategy" in served.stderr, served.stderr
    assert "Traceback" not in served.stderr
    downgrade(url, "0017")
    upgrade(url)
    check_schema(make_engine(url))


def _stored(url: str) -> tuple[list[tuple[int, str]], dict[str, int], int]:
    """Records (id, status or ``-`` without a status), winners by key, and the trials' count."""
    with make_engine(url).connect() as connection:
        columns = {c["name"] for c in sa.inspect(connection).get_columns("records")}
        status = "status" if "status" in columns else "'-'"
        records = connection.execute(sa.text(f"select id, {status} from records order by id"))
        winners = connection.execute(sa.text("select key_hash, record_id from winners"))
        trials = connection.execute(sa.text("select count(*) from trials")).scalar_one()
        return [(r[0], r[1]) for r in records], dict(winners.all()), trials


def test_a_rejected_or_disputed_record_is_never_served_after_going_back_and_upgrading(
    database: tuple[str, Path | None],
) -> None:
    """A verifier rejected a key's fast record (1.0 ms) and the slower one (3.0 ms) was served;
    after ``db downgrade --revision 0006`` and ``db upgrade`` the rejected one was ``pending``
    again, and once a consumer disputed the slower one, a lookup served the rejected config.
    Going back now deletes rejected and disputed records with their trials; a winner row left
    on one goes to the key's fastest validated record left."""
    from cache_server.db import make_sessionmaker
    from cache_server.queries import add_record, get_winner
    from cache_server.trust import add_dispute, recompute_winners
    from tests.factories import knobs, make_key, make_record
    from tunecache.verification import DisputeCreate

    url, _ = database
    upgrade(url)
    key, other = make_key(m=64), make_key(m=128)
    sessions = make_sessionmaker(make_engine(url))
    with sessions.begin() as session:
        fast, slow, doubted, kept = (
            add_record(session, key_hash=k.digest(), record=make_record(k, time_ms=ms,
                                                                        config=knobs(tile)))
            for k, ms, tile in ((key, 1.0, 4), (key, 3.0, 8), (other, 1.0, 4), (other, 2.0, 8))
        )  # fmt: skip
    with sessions.begin() as session:  # as a verifier's rejection leaves it
        session.execute(sa.text("update records set status = 'rejected' where id = :id"),
                        {"id": fast.record_id})  # fmt: skip
        recompute_winners(session, key_hash=key.digest())
    with sessions.begin() as session:
        check = make_record(other).validation.checks[0].model_copy(update={"passed": False})
        add_dispute(session, record_id=doubted.record_id, reporter="r",
                    dispute=DisputeCreate(problem=dict(other.problem), check=check))  # fmt: skip
        # A winner row left on the disputed record (none should be): handed on when going back.
        session.execute(sa.text("update winners set record_id = :id where key_hash = :key"),
                        {"id": doubted.record_id, "key": other.digest()})  # fmt: skip
    downgrade(url, "0006")
    records, winners, trials = _stored(url)
    assert records == [(slow.record_id, "-"), (kept.record_id, "-")]
    assert winners == {key.digest(): slow.record_id, other.digest(): kept.record_id}
    assert trials == 6  # three each of the two records left
    upgrade(url)
    with sessions.begin() as session:
        check = make_record(key).validation.checks[0].model_copy(update={"passed": False})
        add_dispute(session, record_id=slow.record_id, reporter="r",
                    dispute=DisputeCreate(problem=dict(key.problem), check=check))  # fmt: skip
    with sessions() as session:
        assert get_winner(session, key_hash=key.digest()) is None  # not the rejected config
        served = get_winner(session, key_hash=other.digest())
        assert served is not None and served.id == kept.record_id
