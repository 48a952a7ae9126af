"""Reads what the report draws from the server: every matching record, and the trials of a few
winners (the record list leaves trials out; each search is one more request)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tunecache.report.labels import key_label, natural, several_archs
from tunecache.report.series import Convergence, convergence
from tunecache.schemas import RecordList, RecordPublic

PAGE = 1000  # the server's default maximum page
MAX_REQUESTS = 10_000  # pages one read may ask for


@dataclass(frozen=True)
class Searches:
    """The convergence series drawn, and the winners left out (``without_trials`` of them were
    read and had no successful trial)."""

    series: list[Convergence]
    not_shown: int
    without_trials: int


def fetch_records(client: Any, **filters: Any) -> list[RecordPublic]:
    """Every record matching ``filters`` (``kernel``, ``backend``, ``device_arch`` …), page by
    page, without trials.

    Raises:
        ServerError: the server is unreachable or refused.
    """
    return fetch_first(client, None, **filters).items


def fetch_first(client: Any, limit: int | None, *, requests: int = MAX_REQUESTS,
                **filters: Any) -> RecordList:  # fmt: skip
    """The first ``limit`` records matching ``filters`` (every one: ``None``), page by page (a
    server cuts a page short at its byte budget: the next starts after what came), in at most
    ``requests`` requests (a server that answers a page of one item and a huge count is not
    asked for ever), and how many match: fewer items than that count, the caller says so.

    Raises:
        ServerError: the server is unreachable or refused.
    """
    found: list[RecordPublic] = []
    count = 0
    for _ in range(requests):
        if limit is not None and len(found) >= limit:
            break
        size = PAGE if limit is None else min(PAGE, limit - len(found))
        page = client.list_records(limit=size, offset=len(found), **filters)
        found.extend(page.items[:size])
        count = page.count
        if not page.items or len(found) >= count:
            break
    return RecordList(items=found, count=count)


def fetch_searches(client: Any, winners: Sequence[RecordPublic], *, keys: int) -> Searches:
    """The convergence of up to ``keys`` winners, in label order; a winner without a successful
    trial is passed over for the next.

    Raises:
        ServerError: the server is unreachable or refused.
    """
    with_arch = several_archs([w.key for w in winners])
    ordered = sorted(winners, key=lambda w: natural(key_label(w.key, with_arch=with_arch)))
    series: list[Convergence] = []
    read = 0
    for winner in ordered:
        if len(series) == keys:
            break
        read += 1
        if winner.search.trials == 0:
            continue  # nothing to ask for
        full = client.get_record(winner.id)
        found = convergence(full, key_label(full.key, with_arch=with_arch))
        if found is not None:
            series.append(found)
    return Searches(series, len(winners) - len(series), read - len(series))
