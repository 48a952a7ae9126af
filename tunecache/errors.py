"""Errors raised by tunecache.

The tree is shallow on purpose::

    TunecacheError
    ├── InvalidInput          bad workload, backend, dtype, shape or config (CLI exit 2)
    ├── ServerError           the cache server answered with an error the caller must see
    └── TuningError           a tuning run could not produce a validated winner

Lookups through :class:`tunecache.Client` never raise these into user code: a failed remote read
logs once and falls back to the default config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")


class TunecacheError(Exception):
    """Root of every error tunecache raises on purpose."""


class InvalidInput(TunecacheError, ValueError):
    """The caller asked for something that does not exist or is malformed."""


class ServerError(TunecacheError):
    """The cache server rejected a request or could not be reached for a write."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class TuningError(TunecacheError):
    """A tuning run failed to produce a validated winner."""


def lookup(table: Mapping[str, T], name: str, what: str) -> T:
    """``table[name]``, or :class:`InvalidInput` naming ``what`` was unknown and what is known."""
    try:
        return table[name]
    except KeyError:
        raise InvalidInput(f"unknown {what} {name!r}; known: {', '.join(sorted(table))}") from None
