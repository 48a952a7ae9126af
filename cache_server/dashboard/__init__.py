"""A read-only dashboard of the cache, and Swagger UI, both served from this package.

Pages (HTML, left out of the OpenAPI schema; the JSON API stays under ``/v1/``):

- ``/``: the winners by kernel × device × backend, with speedups and validation error; filters
  ``?kernel=``, ``?backend=``, ``?device_arch=`` (and ``?all=1`` for every record);
- ``/ui/records/{id}``: one record: config, validation, provenance, trials and a convergence plot;
- ``/ui/jobs``: the job queue: counts by state, leases, attempts and errors;
- ``/docs``: Swagger UI from the ``swagger-ui-bundle`` package; ``/openapi.json`` as before.

Nothing a page loads comes from another host: templates, CSS and Swagger UI's files are in the
package, the plot is SVG drawn on the server, and a Content-Security-Policy header tells the
browser to load from this server only. Pages read like the API: with ``READS=token`` they need a
token (:mod:`cache_server.dashboard.access`).

Example:
    >>> from fastapi import FastAPI
    >>> app = FastAPI(docs_url=None, redoc_url=None)
    >>> install(app)
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from cache_server.dashboard import access, docs, pages
from cache_server.dashboard.templating import STATIC_DIR

__all__ = ["install"]


def install(app: FastAPI) -> None:
    """Adds the dashboard's pages, its static files, local Swagger UI and its error pages."""
    app.include_router(pages.router)
    app.include_router(docs.router)
    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static")
    access.install(app)
