"""Engines and sessions. SQLite runs in WAL mode with a busy timeout; PostgreSQL as configured."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from cache_server.settings import STATEMENT_SECONDS
from tunecache.errors import InvalidInput
from tunecache.folders import private_file, private_folder
from tunecache.settings import default_db_url, without_userinfo

SQLITE_BUSY_TIMEOUT_MS = 30_000


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.close()


def shown_url(url: str) -> str:
    """A database URL as a message may show it: without its password (SQLAlchemy's rendering),
    or, one it cannot parse, without what comes before its last ``@``."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # any parse error of a malformed URL
        return without_userinfo(url)


def scrubbed(message: str, url: str) -> str:
    """``message`` (a driver's or SQLAlchemy's error) with ``url`` in it shown as
    :func:`shown_url` shows it."""
    return message.replace(url, shown_url(url))


CONNECT_SECONDS = 10  # to reach a PostgreSQL server and log in


def make_engine(url: str, *, statement_seconds: float | None = STATEMENT_SECONDS) -> Engine:
    """An engine for ``url``. The default SQLite file's folder (in the user cache directory) is
    created if missing, private (0700); a SQLite file is created private (0600) if missing; any
    other SQLite file's folder must exist: a mistyped path is an error,
    never a new folder somewhere.

    On PostgreSQL every statement, and every wait for a lock, is bounded by
    ``statement_seconds`` (``None`` or 0: no bound, for migrations): a table locked by an
    operator's ``LOCK TABLE`` or a long migration held a request, and its API slot, for as long
    as the lock lasted (39 s), while the client had given up after 5. Past the bound PostgreSQL
    cancels the statement (``QueryCanceled``, ``LockNotAvailable``), which the API answers as a
    database that does not answer: 503 with ``Retry-After`` (:mod:`cache_server.api.errors`).

    Raises:
        InvalidInput: a SQLite file whose folder does not exist or is not a folder.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            _sqlite_folder(Path(parsed.database), default=url == default_db_url())
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # A server that accepts the connection and never answers hung `serve` and `db upgrade`
    # without a word: libpq's connect_timeout bounds it (unless the URL names its own).
    connect: dict[str, Any] = {}
    if "connect_timeout" not in parsed.query:
        connect["connect_timeout"] = CONNECT_SECONDS
    if statement_seconds:
        connect["options"] = _bounds(statement_seconds, parsed.query.get("options"))
    return create_engine(url, pool_pre_ping=True, connect_args=connect)


def _bounds(seconds: float, given: str | tuple[str, ...] | None) -> str:
    """libpq's ``options`` setting ``statement_timeout`` and ``lock_timeout`` for the session;
    the URL's own ``options`` come after, so a setting it names wins (the connection's options
    replace the URL's, which would otherwise be lost)."""
    ms = max(1, round(seconds * 1000))
    ours = f"-c statement_timeout={ms} -c lock_timeout={ms}"
    theirs = " ".join([given] if isinstance(given, str) else given or ())
    return f"{ours} {theirs}".strip()


def _sqlite_folder(path: Path, *, default: bool) -> None:
    """Checks a SQLite file's folder, making the default one (0700: token hashes, records and
    jobs are no other local user's), and creates the file 0600 if missing (docs/server.md)."""
    folder = path.parent
    if default:
        try:
            private_folder(folder, "the database folder")
        except OSError as exc:  # a refusal of ours names the folder; the system's does not
            said = f"the database folder {folder}: {exc.strerror}" if exc.strerror else str(exc)
            raise InvalidInput(said) from None
    elif not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        hint = "" if path.is_absolute() else (
            f" (a relative path, from {Path.cwd()}: an absolute one takes four slashes, "
            f"sqlite:////{path})")  # fmt: skip
        raise InvalidInput(f"--db: the SQLite file's folder {folder} {what}{hint}")
    elif path.exists() and not path.is_file():
        raise InvalidInput(f"--db: {path} is not a file")
    with contextlib.suppress(OSError):  # one that cannot be created: SQLite's error says why
        private_file(path)


def upsert_insert(session: Session, model: type[Any]) -> Any:
    """``INSERT`` into ``model``'s table with ``ON CONFLICT`` support, in the session's dialect."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(model)
    if dialect == "sqlite":
        return sqlite.insert(model)
    raise NotImplementedError(f"no atomic upsert for database dialect {dialect!r}")


T = TypeVar("T")


def again_after_a_conflict(session: Session, write: Callable[[], T]) -> T:
    """``write()``; when a unique index refuses it (the same upload stored meanwhile by another
    request, sent again before its answer), the transaction is rolled back and ``write()`` runs
    once more, finding what the other stored."""
    try:
        return write()
    except IntegrityError:
        session.rollback()
        return write()


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
