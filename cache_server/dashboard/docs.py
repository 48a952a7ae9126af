"""``/docs``: Swagger UI from the ``swagger-ui-bundle`` package, not from a CDN.

Only the three files the page loads are served (``/ui/swagger/<name>``), not the bundle's whole
folder, whose demo ``index.html`` would load the Petstore from the internet. The online
validator badge, which fetches from swagger.io, is turned off. There is no ``/redoc``: the
bundle has no ReDoc.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import swagger_ui_bundle
from fastapi import APIRouter, HTTPException, Request, status
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse

from cache_server.dashboard.templating import root_path

BUNDLE: Final = Path(swagger_ui_bundle.swagger_ui_path)
FILES: Final = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon-32x32.png": "image/png",
}
# Swagger UI runs inline script and sets inline styles; everything else: this server only.
DOCS_CSP: Final = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; base-uri 'none'; frame-ancestors 'none'"
)

router = APIRouter(include_in_schema=False)


@router.get("/docs")
def swagger_ui(request: Request) -> HTMLResponse:
    """The interactive API reference, reading ``/openapi.json``."""
    root = root_path(request)
    response = get_swagger_ui_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title} API",
        swagger_js_url=f"{root}/ui/swagger/swagger-ui-bundle.js",
        swagger_css_url=f"{root}/ui/swagger/swagger-ui.css",
        swagger_favicon_url=f"{root}/ui/swagger/favicon-32x32.png",
        oauth2_redirect_url=f"{root}/docs/oauth2-redirect",
        swagger_ui_parameters={"validatorUrl": None},
    )
    response.headers["Content-Security-Policy"] = DOCS_CSP
    return response


@router.get("/docs/oauth2-redirect")
def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/ui/swagger/{name}")
def swagger_file(name: str) -> FileResponse:
    """One of Swagger UI's files, from the installed bundle."""
    if name not in FILES:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no file {name!r}")
    return FileResponse(
        BUNDLE / name, media_type=FILES[name], headers={"Cache-Control": "public, max-age=3600"}
    )
