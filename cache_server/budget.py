"""What one answer may hold: a byte budget for listings of stored JSON (configs, artifacts).

A listing's count bounds its rows, not its bytes: each record's config and each artifact's value
may be 256 KiB, so a page of 1,000 was up to 256 MB to read, build and send, for any reader a
write token's uploads made fat (a few such reads at once would exhaust a server's memory). A
listing first reads its rows' ids and the sizes of their JSON (:class:`json_bytes`, in the
database: nothing large is loaded), keeps the leading rows whose JSON fits in the server's
``answer_bytes`` together (default 8 MiB; :func:`fitting`; at least one), and loads those.
An answer cut short says so as a shorter page: clients page on by what they received
(``offset`` plus the items' count; artifacts' ``next_after``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Integer, func, literal
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement


class json_bytes(FunctionElement[int]):  # named as an SQL function, as SQLAlchemy names them
    """The bytes of a JSON column's stored text, computed by the database."""

    type = Integer()
    inherit_cache = True
    name = "json_bytes"


@compiles(json_bytes, "postgresql")
def _postgresql_bytes(element: json_bytes, compiler: Any, **kw: Any) -> str:
    return f"octet_length(CAST({compiler.process(element.clauses, **kw)} AS TEXT))"


@compiles(json_bytes, "sqlite")
def _sqlite_bytes(element: json_bytes, compiler: Any, **kw: Any) -> str:
    return f"length(CAST({compiler.process(element.clauses, **kw)} AS BLOB))"


def stored_size(*columns: Any) -> Any:
    """The bytes of ``columns``' stored JSON together, as an SQL expression (a NULL counts 0)."""
    return sum((func.coalesce(json_bytes(column), 0) for column in columns), start=literal(0))


def fitting(sizes: Sequence[int | None], budget: int) -> int:
    """How many of the leading ``sizes`` fit in ``budget`` bytes together: at least one (an
    answer always makes progress), all of them when they fit."""
    total = 0
    for count, size in enumerate(sizes):
        total += size or 0
        if total > budget and count:
            return count
    return len(sizes)
