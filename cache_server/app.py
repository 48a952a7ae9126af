"""The FastAPI application factory.

Example:
    >>> from cache_server.app import create_app
    >>> from cache_server.settings import ServerSettings
    >>> app = create_app(ServerSettings(db="sqlite:///tunecache.db"))  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from cache_server import tokens
from cache_server.api import errors, problems
from cache_server.api.limits import BodySizeLimit
from cache_server.api.routes import artifacts as artifact_routes
from cache_server.api.routes import health, jobs, records, snapshots
from cache_server.api.routes import tokens as token_routes
from cache_server.api.routes import trust as trust_routes
from cache_server.dashboard import install as install_dashboard
from cache_server.db import make_engine, make_sessionmaker
from cache_server.metrics import Metrics, ObserveRequests
from cache_server.metrics import router as metrics_router
from cache_server.migrate import check_schema
from cache_server.ratelimit import RateLimiter
from cache_server.settings import ServerSettings
from tunecache import __version__

logger = logging.getLogger(__name__)


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    """A cache server app on ``settings.db``; it refuses to start on an outdated schema."""
    settings = settings or ServerSettings()
    engine = make_engine(settings.db)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        check_schema(engine)
        if settings.bootstrap_token is not None:
            _bootstrap(app, settings.bootstrap_token)
        logger.info("serving %s", engine.url.render_as_string(hide_password=True))
        yield
        engine.dispose()

    app = FastAPI(
        title="tunecache",
        version=__version__,
        summary="Validated kernel tuning results, served by key.",
        lifespan=lifespan,
        docs_url=None,  # served from the package, not a CDN: cache_server.dashboard.docs
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.sessionmaker = make_sessionmaker(engine)
    app.state.metrics = Metrics(app.state.sessionmaker)
    app.state.miss_limiter = RateLimiter(settings.miss_reports_per_minute)
    app.state.dispute_limiter = RateLimiter(settings.disputes_per_minute)
    app.include_router(health.router)
    app.include_router(metrics_router)
    app.include_router(records.router)
    app.include_router(jobs.router)
    app.include_router(snapshots.router)
    app.include_router(token_routes.router)
    app.include_router(artifact_routes.router)
    app.include_router(trust_routes.router)
    install_dashboard(app)

    errors.install(app)
    problems.document(app)

    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body)
    app.add_middleware(ObserveRequests, metrics=app.state.metrics)  # outermost: sees 413s too
    return app


def _bootstrap(app: FastAPI, token: str) -> None:
    with app.state.sessionmaker.begin() as session:
        if tokens.ensure(session, token=token, name="bootstrap", scope="admin"):
            logger.info("stored the bootstrap admin token (hashed)")
