"""Server settings, read from ``TUNECACHE_SERVER_*`` environment variables.

- ``TUNECACHE_SERVER_DB``: SQLAlchemy database URL (default: a SQLite file in the user cache dir)
- ``TUNECACHE_SERVER_HOST``: the address ``tunecache serve`` binds (default ``127.0.0.1``)
- ``TUNECACHE_SERVER_PORT``: the port ``tunecache serve`` binds (default 8765)
- ``TUNECACHE_SERVER_MAX_BODY``: largest accepted request body, in bytes (default 16 MiB)
- ``TUNECACHE_SERVER_LIST_LIMIT``: most records one list request returns (default 1000)
- ``TUNECACHE_SERVER_WORKERS``: server processes ``tunecache serve`` runs (default 1)
"""

from __future__ import annotations

import os

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tunecache.settings import DEFAULT_PORT, default_db_url


class ServerSettings(BaseSettings):
    """Typed server settings; a bad value raises ``ValueError`` naming the variable."""

    model_config = SettingsConfigDict(env_prefix="TUNECACHE_SERVER_", frozen=True)

    db: str = Field(default_factory=default_db_url)
    host: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535)
    max_body: int = Field(default=16 * 2**20, gt=0)
    list_limit: int = Field(default=1000, gt=0)
    workers: int = Field(default=1, ge=1, le=64)

    def export(self) -> None:
        """Puts these settings into this process's environment, for the worker processes that
        ``tunecache serve --workers N`` starts (each builds its app from the environment)."""
        for name, value in self.model_dump().items():
            os.environ[f"TUNECACHE_SERVER_{name.upper()}"] = str(value)

    @field_validator("db")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if value.startswith("postgresql://"):  # SQLAlchemy would pick psycopg2; we ship psycopg 3
            return "postgresql+psycopg://" + value.removeprefix("postgresql://")
        if not value.startswith(("sqlite://", "postgresql+psycopg://")):
            raise ValueError(f"database URL {value!r} must be sqlite:// or postgresql://")
        return value
