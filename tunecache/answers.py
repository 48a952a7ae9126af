"""How many JSON arrays and objects each answer a client reads may hold, counted before it is
parsed (:func:`tunecache.http.parse`'s ``max_containers``): building a Python object costs far
more than reading its two bytes, and an 8 MiB listing of empty lists took 29 s and 4.9 GB to
parse (32 MiB: 10 GB).

Each bound is what a real server's answer holds, with a wide margin. Measured on a real server
(1,000 MetaSchedule winners, each with a trace of 18 instructions, 3 baselines and a check): a
page of 1,000 listed records held 108,666 (2.9 MB), a record read by id with 2,000 trials of
such traces 168,106 (2.4 MB), a snapshot of those 1,001 records 107,772, a page of 1,000 jobs
6,002, ``/health`` 1.

Example:
    >>> record_page(50) == LISTED_PAGE_CONTAINERS
    True
    >>> job_page(1000)
    64064
"""

from __future__ import annotations

from typing import Any

import httpx

from tunecache.errors import ServerError
from tunecache.http import LOOKUP_ANSWER_CONTAINERS, foreign, is_tunecache
from tunecache.jsonsafe import parse_json, past_bound

SERVER_PAGE = 1000  # items a server lists at most in one page (its default list limit)
# A listing's page: each record as much as a lookup's (one record, all its checks: more than a
# listed one), and no page more than the densest a server's default 8 MiB page budget holds
# (traces, about 12.6 bytes a container: some 700,000), 9.6 times the real page above.
LISTED_PAGE_CONTAINERS = 2**20
# A record read by id, trials and all: a server takes uploads of 16 MiB at most, some 1.3
# million containers of traces; 25 times the real record of 2,000 trials above.
RECORD_CONTAINERS = 2**22
# A snapshot: at most 128 MiB of stored records (the server's default), some 11 million
# containers of traces; 50,000 winners (the most one holds) like those above hold 5.4 million.
SNAPSHOT_CONTAINERS = 2**24
JOB_CONTAINERS = 64  # of one job: 6 in the real page above (a job and its key's five)
SMALL_ANSWER_CONTAINERS = 1024  # ``/health``, or one job as claimed or queued


def record_page(limit: Any) -> int:
    """The containers a page of at most ``limit`` listed records may hold (unset: the largest
    page a server lists)."""
    records = limit if isinstance(limit, int) and limit > 0 else SERVER_PAGE
    return min(LISTED_PAGE_CONTAINERS, records * LOOKUP_ANSWER_CONTAINERS)


def job_page(limit: Any) -> int:
    """The containers a page of at most ``limit`` jobs may hold (unset: the largest page)."""
    jobs = limit if isinstance(limit, int) and limit > 0 else SERVER_PAGE
    return JOB_CONTAINERS * (min(jobs, SERVER_PAGE) + 1)


def json_answer(response: httpx.Response, path: str, max_containers: int) -> Any:
    """The answer of ``path`` as plain JSON (any value), refused unread when it holds more than
    ``max_containers`` arrays and objects (as :func:`tunecache.http.parse` refuses one).

    Raises:
        ServerError: the answer holds too many containers, or is not JSON.
    """
    if past := past_bound(response.content, max_containers):
        raise _bad(response, path, f"{path} gave a bad answer: {past}")
    try:
        return parse_json(response.content)
    except ValueError as exc:
        raise _bad(response, path, f"{path} gave no JSON: {exc}") from None


def _bad(response: httpx.Response, path: str, why: str) -> ServerError:
    """A bad answer's error: :func:`~tunecache.http.foreign` when it is not a tunecache server's
    (a web page at the URL is a wrong URL, not a broken server)."""
    return ServerError(why) if is_tunecache(response) else foreign(response, path)
