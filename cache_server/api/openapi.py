"""The OpenAPI document is the validation: what the server checks at run time, the document says.

FastAPI writes the document from the route signatures and the wire models; :func:`document` then
adds what only the running app knows:

- every error status an operation can answer, in one shape (:func:`~cache_server.api.problems.
  add_errors`), and the links between operations (:func:`~cache_server.api.links.add_links`);
- security as the server applies it: the reads a caller may make without a token
  (:data:`~cache_server.api.auth.OPEN_READ_SCHEME`) list ``{}`` beside the bearer scheme where
  reads are open (``TUNECACHE_SERVER_READS=open``: the token is optional there), and need the
  token where they are not;
- bounds that are settings: ``GET /v1/records``'s ``limit`` maximum is ``list_limit``.

:func:`allowed_methods` answers a 405's ``Allow`` from the same document.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI

from cache_server.api.auth import OPEN_READ_SCHEME
from cache_server.api.links import add_links
from cache_server.api.problems import add_errors
from cache_server.settings import ServerSettings

BEARER = "HTTPBearer"
METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})


def document(app: FastAPI, settings: ServerSettings) -> None:
    """Makes ``app.openapi()`` return the completed document (built once)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            add_errors(schema)
            add_links(schema)
            follow_settings(schema, settings)
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def follow_settings(schema: dict[str, Any], settings: ServerSettings) -> None:
    """Security and bounds as ``settings`` make them (see the module doc)."""
    schemes = schema.get("components", {}).get("securitySchemes", {})
    if OPEN_READ_SCHEME in schemes:
        schemes.setdefault(BEARER, schemes[OPEN_READ_SCHEME])
        del schemes[OPEN_READ_SCHEME]
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            if method not in METHODS:
                continue
            security = operation.get("security", [])
            if any(OPEN_READ_SCHEME in requirement for requirement in security):
                operation["security"] = [{BEARER: []}]
                if settings.reads == "open":
                    operation["security"].append({})  # the token is optional
            for parameter in operation.get("parameters", []):
                if (path, parameter["name"]) == ("/v1/records", "limit"):
                    parameter["schema"]["maximum"] = settings.list_limit


def allowed_methods(schema: dict[str, Any], path: str) -> list[str] | None:
    """The methods the document gives ``path`` (a literal path first, else every template that
    matches it); ``None`` when the document does not have it (a page, not the API)."""
    paths = schema.get("paths", {})
    if path in paths:
        return sorted(m.upper() for m in paths[path] if m in METHODS)
    found = {
        method.upper()
        for template, operations in paths.items()
        if re.fullmatch(re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)), path)
        for method in operations
        if method in METHODS
    }
    return sorted(found) or None
