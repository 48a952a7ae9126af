"""The tunecache cache server: FastAPI + SQLAlchemy 2.0 over SQLite (embedded) or PostgreSQL.

Errors::

    CacheServerError
    └── SchemaOutdated     the database is not at the Alembic head (`tunecache db upgrade`)
"""

from __future__ import annotations


class CacheServerError(Exception):
    """Root of the errors the cache server raises on purpose."""


class SchemaOutdated(CacheServerError):
    """The database schema is older (or newer) than this server's migrations."""
