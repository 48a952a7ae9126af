"""The dashboard's pages: records by key, one record, the job queue. Read-only, HTML."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import BeforeValidator

from cache_server import jobs, queries
from cache_server.api.deps import SessionDep
from cache_server.dashboard import queries as dashboard_queries
from cache_server.dashboard.access import PageError, Reader
from cache_server.dashboard.svg import convergence_svg
from cache_server.dashboard.templating import page
from cache_server.trust import winner_table
from tunecache.jobs import JobPublic, JobState
from tunecache.schemas import MAX_ID, STORED, Backend, Name

PAGE_SIZE = 100
# A record's page lists its first trials only: an upload may keep 20,000 (a page of 4.5 MB that
# took 1.4 s to make); the plot shows them all, and GET /v1/records/{id} has every one.
TRIALS_SHOWN = 200
# A filter is validated as the API's (a name, a backend, a job state); the form's "any" sends "".
_BLANK_IS_ANY = BeforeValidator(lambda value: value or None)
NameFilter = Annotated[Name | None, Query(), _BLANK_IS_ANY]
PageNumber = Annotated[int, Query(ge=1, le=1_000_000)]

router = APIRouter(include_in_schema=False)


def _pages(total: int, number: int, shown: int | None = None) -> dict[str, int]:
    """Where a page of ``PAGE_SIZE`` rows starts and ends, and how many pages there are;
    ``shown``: the rows the page shows, when the server's byte budget cut it short (``cut``:
    how many it leaves out)."""
    last = max(1, -(-total // PAGE_SIZE))
    first_row = (number - 1) * PAGE_SIZE
    last_row = min(total, first_row + PAGE_SIZE)
    cut = 0 if shown is None else max(0, last_row - first_row - shown)
    return {"number": number, "last": last, "first_row": first_row + 1,
            "last_row": last_row - cut, "total": total, "cut": cut}  # fmt: skip


@router.get("/", response_class=HTMLResponse)
def index(
    request: Request,
    session: SessionDep,
    _reader: Reader,
    kernel: NameFilter = None,
    backend: Annotated[Backend | None, Query(), _BLANK_IS_ANY] = None,
    device_arch: NameFilter = None,
    all: bool = False,
    p: PageNumber = 1,
) -> HTMLResponse:
    """Winners (or, with ``all``, every record) by kernel × device × backend."""
    settings = request.app.state.settings
    filters = queries.RecordFilters(kernel=kernel, backend=backend, device_arch=device_arch)
    records, total = queries.list_records(
        session,
        filters=filters,
        winners_only=not all,
        limit=PAGE_SIZE,
        offset=(p - 1) * PAGE_SIZE,
        by_key=True,
        table=winner_table(settings.policy),
        budget=settings.answer_bytes,  # fat records: a page of 100 was 425 MB to build
    )
    return page(
        request,
        "index.html",
        {
            "records": records,
            "filters": filters,
            "all": all,
            "choices": dashboard_queries.choices(session, winner_table(settings.policy)),
            "pages": _pages(total, p, shown=len(records)),
            "query": {k: v for k, v in [*asdict(filters).items(), ("all", all)] if v},
        },
    )


@router.get("/ui/records/{record_id}", response_class=HTMLResponse)
def record(
    request: Request,
    session: SessionDep,
    _reader: Reader,
    record_id: Annotated[int, Path(ge=1, le=MAX_ID)],
) -> HTMLResponse:
    """One record: its key, config, timing, baselines, validation, provenance and search."""
    table = winner_table(request.app.state.settings.policy)
    found = queries.get_record(session, record_id=record_id, table=table,
                               with_trials=TRIALS_SHOWN)  # fmt: skip
    if found is None:
        raise PageError(404, f"There is no record {record_id}.")
    times = queries.trial_times(session, record_id=record_id)
    return page(request, "record.html", {"r": found, "plot": convergence_svg(times),
                                         "stored": len(times)})  # fmt: skip


@router.get("/ui/jobs", response_class=HTMLResponse)
def job_queue(
    request: Request,
    session: SessionDep,
    _reader: Reader,
    state: Annotated[JobState | None, Query(), _BLANK_IS_ANY] = None,
    p: PageNumber = 1,
) -> HTMLResponse:
    """The queue: counts by state, then each job with its lease, attempts and last error."""
    counts = dashboard_queries.job_counts(session)
    rows, total = jobs.list_jobs(session, state=state, limit=PAGE_SIZE, offset=(p - 1) * PAGE_SIZE)
    return page(
        request,
        "jobs.html",
        {
            "jobs": [
                JobPublic.model_validate(row, from_attributes=True, context=STORED) for row in rows
            ],
            "counts": counts,
            "state": state,
            "pages": _pages(total, p),
            "query": {"state": state} if state else {},
        },
    )
