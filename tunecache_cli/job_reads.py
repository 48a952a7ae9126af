"""Reading the job queue for ``pretune`` and ``coverage``: a manifest's jobs, or every one,
within bounds a server is not trusted to keep to."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MAX_JOB_PAGES = 1000  # of 1,000 jobs: a server answering one a page and a huge count ends
# Jobs and bytes one read of the queue holds at most: a server answering every page with new
# jobs and a count of a billion grew the reader by 6 MB a page, up to 1,000 pages. A real page of
# 1,000 jobs was 635 KB (parsed: some 6 MB): 100,000 jobs, a queue of a job per key, is 64 MB
# read and 600 MB held, more than a deployment queues; past either bound the read is an error
# (a part of the queue would show keys as missing, or follow jobs for ever).
MAX_JOBS = 100_000
MAX_JOB_BYTES = 256 * 2**20


def all_jobs(client: Any, hashes: Sequence[str] | None = None) -> dict[str, Any]:
    """The jobs of the keys of ``hashes`` (``None``: every job on the server), by key hash.

    Those keys' are read :data:`~tunecache.jobs.MAX_LISTED_KEYS` at a time: reading the whole
    queue, which any write token may grow with failed jobs of fat keys, made every team's
    ``pretune`` and ``coverage`` read megabytes a poll, then fail past the read's bounds. A
    server that answers with other keys' jobs (one older than the filter) is read whole.

    Raises:
        ServerError: the server is unreachable, refused, or lists more than the bounds of
            :func:`_every_job`.
    """
    from tunecache.http import answer_limit
    from tunecache.jobs import MAX_LISTED_KEYS

    if hashes is None:
        return _every_job(client)
    found: dict[str, Any] = {}
    with answer_limit(MAX_JOB_BYTES):
        for start in range(0, len(hashes), MAX_LISTED_KEYS):
            chunk = list(dict.fromkeys(hashes[start : start + MAX_LISTED_KEYS]))
            read = 0  # a page the server cut short (its answer bytes) is paged on
            for _ in chunk:  # a key's job at most: as many pages as keys, at most
                page = client.list_jobs(limit=len(chunk), offset=read, key_hash=chunk)
                if any(job.key_hash not in chunk for job in page.items):  # no filter there
                    every = _every_job(client)
                    return {h: every[h] for h in hashes if h in every}
                found.update({job.key_hash: job for job in page.items})
                read += len(page.items)
                if not page.items or read >= min(page.count, len(chunk)):
                    break
    return found


def _every_job(client: Any) -> dict[str, Any]:
    """Every job on the server, by key hash (at most :data:`MAX_JOB_PAGES` pages: a server is
    not trusted to end the listing; nor to list at most :data:`MAX_JOBS` jobs and
    :data:`MAX_JOB_BYTES`).

    Raises:
        ServerError: the server is unreachable, refused, or lists more than those bounds.
    """
    from tunecache.errors import ServerError
    from tunecache.http import answer_limit

    found: dict[str, Any] = {}
    too_many = (f"the server lists over {MAX_JOBS:,} jobs or {MAX_JOB_BYTES:,} bytes of them, "
                "more than one read holds: not read")  # fmt: skip
    with answer_limit(MAX_JOB_BYTES) as budget:
        for _ in range(MAX_JOB_PAGES):
            try:
                page = client.list_jobs(limit=1000, offset=len(found))
            except ServerError as exc:
                if budget[1] >= 0:  # not this read's bound: the server failed
                    raise
                raise ServerError(too_many) from exc
            before = len(found)
            found.update({job.key_hash: job for job in page.items[:1000]})  # what was asked for
            if len(found) == before or len(found) >= page.count:
                break
            if len(found) > MAX_JOBS:
                raise ServerError(too_many)
    return found
