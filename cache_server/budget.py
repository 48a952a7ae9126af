"""What one answer may hold: a byte budget for listings of stored JSON (records, artifacts, jobs).

A listing's count bounds its rows, not its bytes: each record's config and each artifact's value
may be 256 KiB, a record's validation 1.8 MB, so a page of 1,000 was up to gigabytes to read,
build and send, for any reader a write token's uploads made fat (a few such reads at once would
exhaust a server's memory). A listing loads only the leading rows of its page whose stored JSON
(every JSON column it loads: :func:`stored_size`, computed by the database, :class:`json_bytes`)
fits in the server's ``answer_bytes`` together (default 8 MiB; at least one row): :func:`within`,
one statement. An answer cut short says so as a shorter page: clients page on by what they
received (``offset`` plus the items' count; artifacts' ``next_after``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Integer, Select, Subquery, func, literal, or_, select
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


def within(
    stmt: Select, keys: Sequence[tuple[Any, bool]], model: Any, size: Any, budget: int, *,
    limit: int, offset: int = 0,
) -> Subquery:  # fmt: skip
    """The leading rows of ``stmt``'s page (``limit`` rows from ``offset``, ordered by ``keys``:
    expressions, each with whether it is descending, the last unique) whose ``size`` (an SQL
    expression of ``model``'s row) fits in ``budget`` together, and the first row whatever its
    size (an answer always makes progress): a subquery of their ids (``id``) and of how many rows
    the page held before the cut (``paged``).

    One subquery, so the sizes are those of the rows the statement that holds it loads (two
    statements let a writer grow a row in between). The page is ordered and limited first (a
    top-N sort: a window over the whole listing made the database sort every matching row); each
    size is computed in a level of its own, then summed in the page's order (a running sum over
    the JSON itself made SQLite sort the rows' whole JSON: 100 records of 1.8 MB, a 290 MB peak).
    """
    names = [f"k{i}" for i in range(len(keys))]
    labeled = [k.label(n) for (k, _), n in zip(keys, names, strict=True)]
    page = (
        stmt.with_only_columns(model.id.label("id"), *labeled, maintain_column_froms=True)
        .order_by(*(_ordered(k, down) for k, down in keys)).limit(limit).offset(offset)
        .subquery()
    )  # fmt: skip
    measured = select(page, size.label("bytes")).join_from(page, model, model.id == page.c.id)
    sized = measured.subquery()
    order = [_ordered(sized.c[n], down) for n, (_, down) in zip(names, keys, strict=True)]
    running = select(
        sized.c.id,
        func.sum(sized.c.bytes).over(order_by=order).label("running"),
        func.row_number().over(order_by=order).label("n"),
        func.count().over().label("paged"),
    ).subquery()
    fits = or_(running.c.running <= budget, running.c.n == 1)
    return select(running.c.id, running.c.paged).where(fits).subquery()


def _ordered(expression: Any, descending: bool) -> Any:
    return expression.desc() if descending else expression
