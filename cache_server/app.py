"""The FastAPI application factory.

Example:
    >>> from cache_server.app import create_app
    >>> from cache_server.settings import ServerSettings
    >>> app = create_app(ServerSettings(db="sqlite:///tunecache.db"))  # doctest: +SKIP
"""

from __future__ import annotations

import gc
import ipaddress
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy.exc import SQLAlchemyError

from cache_server import tokens
from cache_server.api import errors, openapi, problems
from cache_server.api.identity import Identify
from cache_server.api.json_bounds import JsonLimits
from cache_server.api.limits import BodyLimits, ScopeLimits
from cache_server.api.routes import artifacts as artifact_routes
from cache_server.api.routes import health, jobs, records, snapshots
from cache_server.api.routes import tokens as token_routes
from cache_server.api.routes import trust as trust_routes
from cache_server.api.shedding import LoadShedding
from cache_server.dashboard import install as install_dashboard
from cache_server.db import make_engine, make_sessionmaker
from cache_server.metrics import Metrics, ObserveRequests
from cache_server.metrics import router as metrics_router
from cache_server.migrate import check_schema
from cache_server.ratelimit import RateLimiter
from cache_server.settings import ServerSettings
from tunecache import __version__
from tunecache.tokens import Scope

logger = logging.getLogger(__name__)


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    """A cache server app on ``settings.db``; it refuses to start on an outdated schema."""
    settings = settings or ServerSettings()
    engine = make_engine(settings.db, statement_seconds=settings.statement_seconds)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        check_schema(engine)
        if settings.bootstrap_token is not None:
            _bootstrap(app, settings.bootstrap_token)
        # What start-up made (modules, the app, the schemas) never becomes garbage: kept out of
        # the collector's sight, a full collection no longer walks it, and no longer stalls every
        # request in flight (bench/server_load.py --overload: the 503s' p99 fell from ~100 ms
        # to ~30 ms on a 2-core machine).
        gc.collect()
        gc.freeze()
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
    openapi.document(app, settings)

    app.state.json_limits = JsonLimits(settings.max_json_depth, settings.max_json_elements)
    limits = ScopeLimits(anonymous=min(settings.max_body_anonymous, settings.max_body),
                         read=min(settings.max_body_read, settings.max_body),
                         write=settings.max_body)  # fmt: skip
    # Added innermost first: a request meets the identity, the metrics, the body limits (the
    # whole body read, bounded), then load shedding (a slot only for a request that is in).
    app.add_middleware(LoadShedding, max_in_flight=settings.max_in_flight,
                       max_wait=settings.max_wait, retry_after=settings.retry_after,
                       reject=problems.send)  # fmt: skip
    app.add_middleware(BodyLimits, limits=limits, authenticate=_authenticator(app),
                       seconds=settings.body_seconds, reject=problems.send)  # fmt: skip
    app.add_middleware(ObserveRequests, metrics=app.state.metrics)  # sees 413s too
    app.add_middleware(Identify)  # outermost: every answer says it is tunecache's
    return app


def _authenticator(app: FastAPI) -> Callable[[str], Scope | None]:
    """A token's scope (``None``: unknown or revoked), for limits checked before the body."""

    def scope_of(token: str) -> Scope | None:
        with app.state.sessionmaker() as session:
            return tokens.scope_of(session, token=token)

    return scope_of


def _bootstrap(app: FastAPI, token: str) -> None:
    """Stores ``TUNECACHE_SERVER_BOOTSTRAP_TOKEN`` and says truly what became of it: a revoked
    one stays revoked, and an operator who sets it again must hear that it does not work."""
    with app.state.sessionmaker.begin() as session:
        state = tokens.ensure(session, token=token, name="bootstrap", scope="admin")
    if state == "stored":
        logger.info("stored the bootstrap admin token (hashed)")
    elif state == "known":
        logger.info("the bootstrap admin token is already known")
    else:
        logger.warning(
            "TUNECACHE_SERVER_BOOTSTRAP_TOKEN is a REVOKED token: it is refused, it grants "
            "nothing; it stays revoked (unset the variable, or set it to a new token)"
        )


def warn_if_public(settings: ServerSettings) -> None:
    """On an address other machines may reach, one warning of what is open there without a
    token, and that nobody can administer the server when no live admin token exists (nor a
    bootstrap token that start-up will store). Called once by ``tunecache serve``, before it
    binds: a server on 0.0.0.0 over a new database otherwise started without a word."""
    if _loopback(settings.host):
        return
    said = []
    if settings.reads == "open":
        said.append("reads (lookups, records, snapshots, jobs) and anonymous miss reports, which "
                    "queue tuning jobs, are open to anyone who reaches it (set "
                    "TUNECACHE_SERVER_READS=token to require a token)")  # fmt: skip
    if not _administrable(settings):
        said.append("the database holds no live admin token, so nobody can administer it "
                    "until one is made (tunecache token create --db URL --name NAME "
                    "--scope admin)")  # fmt: skip
    if said:
        logger.warning("serving on %s, not loopback: %s", settings.host, "; ".join(said))


def _loopback(host: str) -> bool:
    """Whether ``host`` (as uvicorn binds it) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name: whatever it resolves to, take it as reachable
        return False


def _administrable(settings: ServerSettings) -> bool:
    """Whether a live admin token exists, or the bootstrap token will be one once stored (or
    the database could not say: the warning is advice, and a start must not fail on it)."""
    engine = make_engine(settings.db, statement_seconds=settings.statement_seconds)
    try:
        with make_sessionmaker(engine)() as session:
            return tokens.administrable(session, bootstrap=settings.bootstrap_token)
    except SQLAlchemyError as exc:
        logger.debug("could not count the admin tokens: %s", exc)
        return True
    finally:
        engine.dispose()
