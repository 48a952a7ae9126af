"""The dashboard's pages: records by key, one record, the job queue. Read-only, HTML."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import BeforeValidator

from cache_server import job_pages, queries
from cache_server.api.deps import IdPath, SessionDep
from cache_server.dashboard import queries as dashboard_queries
from cache_server.dashboard.access import PageError, PageRoute, Reader
from cache_server.dashboard.svg import convergence_svg
from cache_server.dashboard.templating import ms, page
from cache_server.trust import winner_table
from tunecache import search_times
from tunecache.jobs import JobPublic, JobState
from tunecache.key import kernel_names
from tunecache.schemas import STORED, Backend, Name

PAGE_SIZE = 100
# A record's page lists its first trials only: an upload may keep 20,000 (a page of 4.5 MB that
# took 1.4 s to make); the plot shows them all, and GET /v1/records/{id} has every one.
TRIALS_SHOWN = 200
# A filter is validated as the API's (a name, a backend, a job state); the form's "any" sends "".
_BLANK_IS_ANY = BeforeValidator(lambda value: value or None)
NameFilter = Annotated[Name | None, Query(), _BLANK_IS_ANY]
PageNumber = Annotated[int, Query(ge=1, le=1_000_000)]  # the pages' links before "start"
StartRow = Annotated[int | None, Query(ge=0, le=100_000_000)]

router = APIRouter(include_in_schema=False, route_class=PageRoute)


def _pages(total: int, start: int, shown: int) -> dict[str, int | None]:
    """Where a page that shows ``shown`` rows from row ``start`` (0-based) sits among ``total``:
    its rows (1-based), where ``next`` starts (right after what it shows: a page the server's byte
    budget cut short leaves no row out of the next) and ``previous`` (a page size back), and
    ``cut``: the rows of a full page it leaves out."""
    end = start + shown
    cut = max(0, min(PAGE_SIZE, total - start) - shown)
    return {"first_row": start + 1, "last_row": end, "total": total, "cut": cut,
            "next": end if end < total else None,
            "previous": max(0, start - PAGE_SIZE) if start > 0 else None}  # fmt: skip


def _start(start: int | None, number: int) -> int:
    """The first row (0-based) a page asks for: ``start``, else page ``number``'s (the old
    links')."""
    return start if start is not None else (number - 1) * PAGE_SIZE


@router.get("/", response_class=HTMLResponse)
def index(
    request: Request,
    session: SessionDep,
    _reader: Reader,
    kernel: NameFilter = None,
    backend: Annotated[Backend | None, Query(), _BLANK_IS_ANY] = None,
    device_arch: NameFilter = None,
    all: bool = False,
    start: StartRow = None,
    p: PageNumber = 1,
) -> HTMLResponse:
    """Winners (or, with ``all``, every record) by kernel × device × backend."""
    settings = request.app.state.settings
    first = _start(start, p)
    filters = queries.RecordFilters(kernel=kernel, backend=backend, device_arch=device_arch)
    records, total = queries.list_records(
        session,
        filters=filters,
        winners_only=not all,
        limit=PAGE_SIZE,
        offset=first,
        by_key=True,
        table=winner_table(settings.policy),
        budget=settings.answer_bytes,  # fat records: a page of 100 was 425 MB to build
    )
    return page(
        request,
        "index.html",
        {
            "records": records,
            "kernels": kernel_names([r.key for r in records]),
            "filters": filters,
            "all": all,
            "choices": dashboard_queries.choices(session, winner_table(settings.policy)),
            "pages": _pages(total, first, len(records)),
            "query": {k: v for k, v in [*asdict(filters).items(), ("all", all)] if v},
            "stored": dashboard_queries.stored_trials(session, [r.id for r in records]),
            "defaults": dashboard_queries.default_last(session, records),
        },
    )


@router.get("/ui/records/{record_id}", response_class=HTMLResponse)
def record(
    request: Request,
    session: SessionDep,
    _reader: Reader,
    record_id: IdPath,
) -> HTMLResponse:
    """One record: its key, config, timing, baselines, validation, provenance and search."""
    table = winner_table(request.app.state.settings.policy)
    found = queries.get_record(session, record_id=record_id, table=table,
                               with_trials=TRIALS_SHOWN)  # fmt: skip
    if found is None:
        raise PageError(404, f"There is no record {record_id}.")
    times = queries.trial_times(session, record_id=record_id)
    default = found.id in dashboard_queries.default_last(session, [found])
    said = search_times.note(found.search.strategy, found.key.backend, times,
                             found.believed_timing.median_ms, ms, default_last=default)  # fmt: skip
    return page(request, "record.html", {"r": found, "plot": convergence_svg(times, default),
                                         "stored": len(times), "default": default,
                                         "said": said and said[0].upper() + said[1:]})  # fmt: skip


@router.get("/ui/jobs", response_class=HTMLResponse)
def job_queue(
    request: Request,
    session: SessionDep,
    _reader: Reader,
    state: Annotated[JobState | None, Query(), _BLANK_IS_ANY] = None,
    start: StartRow = None,
    p: PageNumber = 1,
) -> HTMLResponse:
    """The queue: counts by state, then each job with its lease, attempts and last error."""
    counts = dashboard_queries.job_counts(session)
    first = _start(start, p)
    rows, total = job_pages.list_jobs(session, state=state, limit=PAGE_SIZE, offset=first,
                                      budget=request.app.state.settings.answer_bytes)  # fmt: skip
    # Each with the tokens that hold its lease and reported its error: the page's, not the API's
    # (a client made before them would refuse fields it does not know).
    shown = [(JobPublic.model_validate(row, from_attributes=True, context=STORED),
              row.lease_token_name, row.error_by) for row in rows]  # fmt: skip
    return page(
        request,
        "jobs.html",
        {
            "jobs": shown,
            "counts": counts,
            "state": state,
            "pages": _pages(total, first, len(rows)),
            "query": {"state": state} if state else {},
        },
    )
