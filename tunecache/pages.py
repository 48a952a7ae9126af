"""Paging through a server's record listing: every page a server sends is taken as it came.

A server cuts a page short at its byte budget (``answer_bytes``), so the next page starts after
what came, not after the size asked for; and a server is not trusted to end the listing (one
answering each page with one item and a huge ``count`` would be asked for ever): a read asks at
most a given number of pages, holds at most a given number of records, and reads at most a given
number of bytes in all (one answering every page with a thousand records and a count of a
billion grew the reader by 12 MB a page, up to 10,000 pages). Past either bound the read stops
with a warning and what it read: fewer items than the count, the caller says so.
"""

from __future__ import annotations

import logging
from typing import Any

from tunecache.errors import ServerError
from tunecache.http import answer_limit
from tunecache.schemas import RecordList, RecordPublic

PAGE = 1000  # the server's default maximum page
MAX_REQUESTS = 10_000  # pages one read may ask for
# Records and bytes one read holds at most. A real page of 1,000 listed MetaSchedule winners
# was 2.9 MB and parsed into some 12 MB, so the bounds stop a read at about 290 MB of answers
# and 1.2 GB held: twice the winners the largest snapshot holds (50,000 of one device arch),
# where a report or listing of a deployment reads its records filtered.
MAX_RECORDS = 100_000
MAX_BYTES = 1024 * 2**20  # room for records with larger configs (traces of 18 instructions here)

logger = logging.getLogger(__name__)


def fetch_first(client: Any, limit: int | None, *, requests: int = MAX_REQUESTS,
                page: int = PAGE, max_records: int = MAX_RECORDS, max_bytes: int = MAX_BYTES,
                **filters: Any) -> RecordList:  # fmt: skip
    """The first ``limit`` records matching ``filters`` (every one: ``None``), page by page (a
    server cuts a page short at its byte budget: the next starts after what came), in at most
    ``requests`` requests (a server that answers a page of one item and a huge count is not
    asked for ever), pages of at most ``page`` records, and how many match: fewer items than that
    count, the caller says so. A read stops, with a warning, at ``max_records`` records or
    ``max_bytes`` of answers read (whoever's client: an in-memory transport's are not counted).

    Raises:
        ServerError: the server is unreachable or refused.
    """
    found: list[RecordPublic] = []
    count, stopped = 0, ""
    wanted = max_records if limit is None else min(limit, max_records)
    with answer_limit(max_bytes) as budget:
        for _ in range(requests):
            if len(found) >= wanted:
                break
            size = min(page, wanted - len(found))
            try:
                answer = client.list_records(limit=size, offset=len(found), **filters)
            except ServerError:
                if budget[1] >= 0:  # not this read's bound: the server failed
                    raise
                stopped = f"{max_bytes:,} bytes"
                break
            found.extend(answer.items[:size])
            count = answer.count
            if not answer.items or len(found) >= count:
                break
    if not stopped and len(found) >= max_records and (limit is None or limit > max_records):
        stopped = f"{max_records:,} records" if count > len(found) else ""
    if stopped:
        logger.warning("read %s of the %s records the server lists, then stopped: one read "
                       "holds at most %s (narrow it with filters)", f"{len(found):,}",
                       f"{count:,}", stopped)  # fmt: skip
    return RecordList(items=found, count=count)
