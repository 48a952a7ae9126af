"""Prometheus metrics of one cache server app, the request-observing middleware, and ``/metrics``.

Each app owns a :class:`Metrics` with its own ``CollectorRegistry`` (never the process-wide
default, so apps built side by side in one process count apart). Families, with their labels:

- ``tunecache_http_requests_total{method, route, status}`` (counter)
- ``tunecache_http_request_duration_seconds{method, route}`` (histogram, 0.5 ms to 10 s)
- ``tunecache_lookups_total{result, rule}`` (counter; ``result`` is ``hit`` or ``miss``)
- ``tunecache_uploads_total{outcome}`` (counter; ``winner``, ``kept`` or ``unvalidated``)
- ``tunecache_misses_reported_total`` (counter)
- ``tunecache_jobs{state}`` (gauge; ``queued``, ``running``, ``done``, ``failed``)
- ``tunecache_records`` (gauge)
- ``tunecache_records_by_status{status}`` (gauge; ``pending``, ``verified``, ``disputed``,
  ``rejected``: a verifier backlog, pending or disputed records growing, can be alerted on; and
  ``unvalidated``: records that failed their uploader's validation, whatever their status, which
  are never served nor verified, so a backlog's alert does not count them)

``status`` is the answer's status, or ``499`` (nginx's "client closed request") for a request
whose client went away before any answer started (it closed the connection while sending its
body, say): no answer was sent, and the server did nothing wrong. A request whose app failed
before answering counts as ``500``.

``route`` is the matched route's template (``/v1/records/{record_id}``), never the raw path, and
``"unmatched"`` when no route matched; ``method`` is one of the standard methods or ``"OTHER"``:
label values come from a fixed, small set whatever clients send.

``rule`` is the lookup rule that answered, as in ``LookupResponse.match`` (``"exact"``,
``"same_arch"`` or ``"bucket"``); a miss, where no rule answered, has ``rule="none"``. Rules
added later are new values of the label on hits, and ``result="miss"`` stays one series.

The database gauges are read at scrape time, with one ``GROUP BY`` of jobs and one of records
in a short session of their own; when the database fails, the scrape still answers,
without them, and the failure is logged.

With several worker processes (``tunecache serve --workers N``), prometheus_client runs in its
multiprocess mode (see :mod:`cache_server.metrics_multiprocess`): every worker writes its
counters and histograms to files in ``PROMETHEUS_MULTIPROC_DIR``, and whichever worker answers
a scrape sums all the workers' files (a dead worker's counts included: counters never go down),
then adds the database gauges once. Counters and histograms then have no ``_created``
samples, and apps in one process no longer count apart. In one process, each app's registry
answers alone.

Example:
    >>> metrics = Metrics()  # no sessionmaker: no database gauges
    >>> metrics.count_lookup(rule="exact")
    >>> b'tunecache_lookups_total{result="hit",rule="exact"} 1.0' in metrics.generate_latest()
    True
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Final, get_args

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client import generate_latest as _generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import case, func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from cache_server import logs, metrics_multiprocess
from cache_server.models import JobRow, RecordRow
from tunecache.jobs import JobState
from tunecache.schemas import RecordStatus

logger = logging.getLogger(__name__)

UNMATCHED: Final = "unmatched"
CLIENT_CLOSED: Final = 499  # nginx's "client closed request": gone before any answer started
MISS_RULE: Final = "none"
METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UPLOAD_OUTCOMES: Final = ("winner", "kept", "unvalidated")
JOB_STATES: Final[tuple[str, ...]] = get_args(JobState)
UNVALIDATED: Final = "unvalidated"  # a record's label there when it failed its validation
RECORD_STATUSES: Final[tuple[str, ...]] = (*get_args(RecordStatus), UNVALIDATED)
# 0.5 ms (a cached lookup on SQLite) to 10 s (a large upload on a busy PostgreSQL).
DURATION_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

REQUEST_ID_KEY: Final = logs.REQUEST_ID_HEADER.lower().encode()  # ASGI header names: lower case

Scope = dict[str, Any]
Message = dict[str, Any]


class DatabaseCollector(Collector):
    """The job-queue depth by state and the record count, read when Prometheus scrapes."""

    def __init__(self, sessionmaker: Callable[[], Session]) -> None:
        self._sessionmaker = sessionmaker

    def describe(self) -> Iterable[Metric]:
        # Names only, so registering neither touches the database nor hides a name clash.
        return [self._jobs(), self._records(), self._by_status()]

    @staticmethod
    def _jobs() -> GaugeMetricFamily:
        return GaugeMetricFamily("tunecache_jobs", "Tuning jobs by state.", labels=["state"])

    @staticmethod
    def _records() -> GaugeMetricFamily:
        return GaugeMetricFamily("tunecache_records", "Uploaded records, validated or not.")

    @staticmethod
    def _by_status() -> GaugeMetricFamily:
        return GaugeMetricFamily("tunecache_records_by_status", "Uploaded records by status.",
                                 labels=["status"])  # fmt: skip

    def collect(self) -> Iterable[Metric]:
        try:
            with self._sessionmaker() as session:
                rows = session.execute(
                    select(JobRow.state, func.count()).group_by(JobRow.state)
                ).all()
                label = case((RecordRow.validated.is_(False), UNVALIDATED),
                             else_=RecordRow.status)  # fmt: skip
                statuses = session.execute(select(label, func.count()).group_by(label)).all()
        except SQLAlchemyError as exc:
            logger.warning("database gauges left out of this scrape: %s", exc)
            return []
        jobs = self._jobs()
        for state, count in _counted(JOB_STATES, rows).items():
            jobs.add_metric([state], count)
        by_status = self._by_status()
        for status, count in _counted(RECORD_STATUSES, statuses).items():
            by_status.add_metric([status], count)
        gauge = self._records()
        gauge.add_metric([], sum(count for _, count in statuses))
        return [jobs, gauge, by_status]


def _counted(labels: Iterable[str], rows: Iterable[Any]) -> dict[str, int]:
    """Each of ``labels`` with its count in ``rows`` (``(label, count)``), 0 where none; a
    label the code does not know (a row written behind the API) is left out of the family."""
    counts = {label: 0 for label in labels}
    counts.update({label: count for label, count in rows if label in counts})
    return counts


class Metrics:
    """One app's metrics: its registry, the counters the routes and middleware bump, and the
    database gauges.

    Args:
        sessionmaker: Opens sessions for the scrape-time gauges; ``None`` leaves them out.
    """

    def __init__(self, sessionmaker: Callable[[], Session] | None = None) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "tunecache_http_requests",
            "HTTP requests answered, by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "tunecache_http_request_duration_seconds",
            "Time from a request's arrival to the end of its response, by method and route.",
            ["method", "route"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.lookups = Counter(
            "tunecache_lookups",
            "Lookups by result (hit|miss) and the rule that answered ('none' on a miss).",
            ["result", "rule"],
            registry=self.registry,
        )
        self.uploads = Counter(
            "tunecache_uploads",
            "Uploaded records by outcome: the key's new winner, kept (validated, not faster), "
            "or unvalidated.",
            ["outcome"],
            registry=self.registry,
        )
        self.misses_reported = Counter(
            "tunecache_misses_reported",
            "Misses clients reported for tuning.",
            registry=self.registry,
        )
        # Series that exist from the start, so rates and ratios have no gaps.
        self.lookups.labels(result="hit", rule="exact")
        self.lookups.labels(result="miss", rule=MISS_RULE)
        for outcome in UPLOAD_OUTCOMES:
            self.uploads.labels(outcome=outcome)
        self._database = None if sessionmaker is None else DatabaseCollector(sessionmaker)
        if self._database is not None:
            self.registry.register(self._database)
        # Set when this process's counters live in files shared with other workers.
        self._multiprocess_dir = metrics_multiprocess.multiprocess_dir()

    def count_lookup(self, *, rule: str | None) -> None:
        """Counts a lookup answered by ``rule`` (a hit), or by none (``None``: a miss)."""
        if rule is None:
            self.lookups.labels(result="miss", rule=MISS_RULE).inc()
        else:
            self.lookups.labels(result="hit", rule=rule).inc()

    def count_upload(self, *, validated: bool, is_winner: bool) -> None:
        """Counts an uploaded record: the new winner, kept (validated), or unvalidated."""
        outcome = "winner" if is_winner else "kept" if validated else "unvalidated"
        self.uploads.labels(outcome=outcome).inc()

    def count_miss_report(self) -> None:
        """Counts a miss a client reported (whether or not it queued a new job)."""
        self.misses_reported.inc()

    def observe_request(self, *, method: str, route: str, status: int, seconds: float) -> None:
        """Counts and times one answered HTTP request (``route`` already a template)."""
        method = method if method in METHODS else "OTHER"
        self.requests.labels(method=method, route=route, status=str(status)).inc()
        self.duration.labels(method=method, route=route).observe(seconds)

    def generate_latest(self) -> bytes:
        """Every metric in the Prometheus text format (every worker's, in multiprocess mode)."""
        if self._multiprocess_dir is None:
            return _generate_latest(self.registry)
        database = () if self._database is None else (self._database,)
        return metrics_multiprocess.generate_latest(self._multiprocess_dir, *database)


async def get_metrics(request: Request) -> Metrics:
    """The app's :class:`Metrics` (a dependency: ``metrics: MetricsDep``)."""
    metrics: Metrics = request.app.state.metrics
    return metrics


MetricsDep = Annotated[Metrics, Depends(get_metrics)]


def route_template(scope: Scope) -> str:
    """The template of the route that served ``scope`` (after routing), or ``"unmatched"``."""
    path = getattr(scope.get("route"), "path", None)
    if isinstance(path, str):
        return path
    # Starlette's own routes (/docs, /openapi.json) leave only their endpoint in the scope.
    endpoint, router = scope.get("endpoint"), scope.get("router")
    if endpoint is not None and router is not None:
        for route in router.routes:
            path = getattr(route, "path", None)
            if getattr(route, "endpoint", None) is endpoint and isinstance(path, str):
                return path
    return UNMATCHED


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


class ObserveRequests:
    """Pure ASGI middleware: times each HTTP request, counts it, logs it, and tags it with an id.

    The id (``X-Request-ID``, see :func:`cache_server.logs.new_request_id`) is echoed in the
    response and set in :data:`cache_server.logs.request_id` while the request is served. The
    time runs to the end of the response, streamed or not; a request whose app fails before
    answering counts as a 500, and one whose client went away before any answer started (the
    app, told ``http.disconnect``, returned without one) as :data:`CLIENT_CLOSED`.

    Args:
        app: The ASGI app to wrap.
        metrics: Where to count requests.
    """

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = logs.new_request_id(_header(scope, REQUEST_ID_KEY))
        echoed = (REQUEST_ID_KEY, rid.encode())
        status = 500
        started = gone = False
        token = logs.request_id.set(rid)
        start = time.perf_counter()

        async def watching_receive() -> Message:
            nonlocal gone
            message: Message = await receive()
            gone = gone or message["type"] == "http.disconnect"
            return message

        async def tagging_send(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
                headers = [h for h in message.get("headers", []) if h[0].lower() != REQUEST_ID_KEY]
                message = {**message, "headers": [*headers, echoed]}
            await send(message)

        try:
            await self.app(scope, watching_receive, tagging_send)
            if gone and not started:  # returned unanswered, the client gone: not a server error
                status = CLIENT_CLOSED
        finally:
            seconds = time.perf_counter() - start
            route = route_template(scope)
            self.metrics.observe_request(
                method=scope["method"], route=route, status=status, seconds=seconds
            )
            raw_path = scope.get("raw_path")
            logs.log_access(
                request_id=rid,
                method=scope["method"],
                path=raw_path.decode("latin-1") if raw_path else scope["path"],
                route=route,
                status=status,
                duration_ms=seconds * 1000,
            )
            logs.request_id.reset(token)


router = APIRouter(tags=["ops"])


@router.get("/metrics", include_in_schema=False, response_class=Response)
def scrape(metrics: MetricsDep) -> Response:
    """Every metric of this server in the Prometheus text format."""
    return Response(metrics.generate_latest(), media_type=CONTENT_TYPE_LATEST)
