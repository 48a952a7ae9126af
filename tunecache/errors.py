"""Errors raised by tunecache.

The tree is shallow on purpose::

    TunecacheError
    ├── InvalidInput          bad workload, backend, dtype, shape or config (CLI exit 2)
    ├── ServerError           the cache server answered with an error the caller must see
    ├── TuningError           a tuning run could not produce a validated winner
    └── CheckUnavailable      a first-use check could not run here (says nothing of the config)

Lookups through :class:`tunecache.Client` never raise these into user code: a failed remote read
logs once and falls back to the default config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class TunecacheError(Exception):
    """Root of every error tunecache raises on purpose."""


class InvalidInput(TunecacheError, ValueError):
    """The caller asked for something that does not exist or is malformed."""


class ServerError(TunecacheError):
    """The cache server rejected a request or could not be reached for a write."""

    def __init__(self, message: str, *, status_code: int | None = None,
                 retry_after: float | None = None, foreign: bool = False,
                 no_route: bool = False) -> None:  # fmt: skip
        super().__init__(message)
        self.status_code = status_code
        self.retry_after = retry_after  # seconds the server asked to wait (503, 429)
        self.foreign = foreign  # the answer was not a tunecache server's (no identity header)
        self.no_route = no_route  # a tunecache server's 404 for a path it has no route for


class TuningError(TunecacheError):
    """A tuning run failed to produce a validated winner."""


class SourcesChanged(TuningError):
    """A kernel's files changed on disk under a worker that had read them: it stops, whether it
    was tuning or idle (``tuner.kernel_versions.changed_on_disk``)."""


class CheckUnavailable(TunecacheError):
    """A first-use check (``verify``) could not run in this process, for a reason of its own:
    no memory for the copies of the arguments, a reference that failed. The served config is
    not used, and not disputed: a process short of memory must not take a good record out of
    service for everyone."""


def one_line(exc: BaseException) -> str:
    """``Type: first non-empty line of the message``, at most 300 characters.

    For errors from code we do not own (a user's file, a database driver): SQLAlchemy's messages
    go on with the SQL and a link, a user's exception with anything.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def error_message(error: Mapping[str, Any]) -> str:
    """What one of pydantic's errors says; a string over its length in characters (pydantic
    says "at most 256 items after validation" of a constrained string type such as ``Line``),
    and our own validators' words without pydantic's "Value error, " before them."""
    given, most = error.get("input"), (error.get("ctx") or {}).get("max_length")
    if error.get("type") == "too_long" and isinstance(given, str) and most is not None:
        return f"at most {most} characters, not {len(given)}"
    return str(error.get("msg", "invalid")).removeprefix("Value error, ")


def validation_problems(exc: Any, limit: int = 3) -> str:
    """A pydantic ``ValidationError``'s first ``limit`` problems, on one line."""
    errors = exc.errors()
    shown = "; ".join(f"{'.'.join(map(str, e['loc'])) or '$'}: {error_message(e)}"
                      for e in errors[:limit])  # fmt: skip
    more = len(errors) - limit
    return shown + (f" (and {more} more)" if more > 0 else "")


def lookup(table: Mapping[str, T], name: str, what: str) -> T:
    """``table[name]``, or :class:`InvalidInput` naming ``what`` was unknown and what is known."""
    try:
        return table[name]
    except KeyError:
        raise InvalidInput(f"unknown {what} {name!r}; known: {', '.join(sorted(table))}") from None
