"""Paging through a server's record listing: every page a server sends is taken as it came.

A server cuts a page short at its byte budget (``answer_bytes``), so the next page starts after
what came, not after the size asked for; and a server is not trusted to end the listing (one
answering each page with one item and a huge ``count`` would be asked for ever): a read asks at
most a given number of pages.
"""

from __future__ import annotations

from typing import Any

from tunecache.schemas import RecordList, RecordPublic

PAGE = 1000  # the server's default maximum page
MAX_REQUESTS = 10_000  # pages one read may ask for


def fetch_first(client: Any, limit: int | None, *, requests: int = MAX_REQUESTS,
                page: int = PAGE, **filters: Any) -> RecordList:  # fmt: skip
    """The first ``limit`` records matching ``filters`` (every one: ``None``), page by page (a
    server cuts a page short at its byte budget: the next starts after what came), in at most
    ``requests`` requests (a server that answers a page of one item and a huge count is not
    asked for ever), pages of at most ``page`` records, and how many match: fewer items than that
    count, the caller says so.

    Raises:
        ServerError: the server is unreachable or refused.
    """
    found: list[RecordPublic] = []
    count = 0
    for _ in range(requests):
        if limit is not None and len(found) >= limit:
            break
        size = page if limit is None else min(page, limit - len(found))
        answer = client.list_records(limit=size, offset=len(found), **filters)
        found.extend(answer.items[:size])
        count = answer.count
        if not answer.items or len(found) >= count:
            break
    return RecordList(items=found, count=count)
