"""One error shape for every 4xx and 5xx, and every status a route can return in its document.

Every error answer is an :class:`ErrorBody` (``application/json``)::

    {"status": 422, "detail": "body.key.problem: needs at least one parameter", "errors": [...]}

``detail`` is one sentence a person can act on; ``errors`` lists each invalid field (its
location, message and type) when the request did not validate, and is empty otherwise.
:func:`add_errors` adds the statuses a route can answer with, each with this model, to the OpenAPI
document: 401 and 403 where a token is checked, 422 where there is anything to validate, 400, 408,
413 and 415 where there is a body, 500 and 503 everywhere — beside the ones a route declares itself
(404, 409, 429).
"""

from __future__ import annotations

import json
from typing import Any, Final

from pydantic import Field

from cache_server.api.identity import IDENTITY
from tunecache.schemas import _Strict

# A request whose content is refused. Starlette's HTTP_422_UNPROCESSABLE_ENTITY is deprecated (a
# warning in the log at the first 422) and its new name is not in every Starlette FastAPI takes.
UNPROCESSABLE: Final = 422


class FieldError(_Strict):
    """One field that did not validate."""

    loc: list[str | int] = Field(description="where: 'body', 'query' or 'path', then the field")
    msg: str = Field(description="what is wrong with it")
    type: str = Field(description="pydantic's error type, e.g. 'missing', 'too_long'")


class ErrorBody(_Strict):
    """Every error answer of the API (4xx and 5xx)."""

    status: int = Field(ge=400, le=599, description="the HTTP status, repeated")
    detail: str = Field(description="what was wrong, in one sentence a person can act on")
    errors: list[FieldError] = Field(
        default_factory=list,
        description="the fields that did not validate, the first 20 (422 only; ``detail`` "
        "counts them all)",
    )


DESCRIPTIONS = {
    400: "the body could not be parsed (not JSON, not UTF-8), or is nested too deeply, holds "
    "too many values or has an object naming a field twice",
    401: "no token, or one the server does not know (or that was revoked)",
    403: "the token's scope does not allow this",
    404: "not found",
    408: "the body did not arrive in time",
    409: "the request conflicts with the current state",
    413: "the body is over its sender's size limit (smaller without a token)",
    415: "the body is not JSON (its Content-Type), or is encoded (its Content-Encoding: gzip)",
    422: "the request did not validate: `errors` names each field",
    429: "over a rate limit: `Retry-After` says when to try again",
    500: "an internal error (a bug: please report it)",
    503: "the server is busy: `Retry-After` says when to try again",
}


def body(status: int, detail: str, errors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An :class:`ErrorBody` as JSON."""
    model = ErrorBody(status=status, detail=detail,
                      errors=[FieldError(**e) for e in errors or []])  # fmt: skip
    return model.model_dump(mode="json")


def raw_answer(
    status: int, reason: str, detail: str, headers: dict[str, str] | None = None
) -> bytes:
    """An :class:`ErrorBody` answer as the bytes of an HTTP/1.1 response that closes its
    connection, for a protocol to write where no app runs (a connection over its address's cap,
    a request's head too large or not HTTP); it says it comes from tunecache
    (:data:`cache_server.api.identity.IDENTITY`) like every other answer."""
    content = json.dumps(body(status, detail)).encode()
    name, value = IDENTITY
    lines = [f"HTTP/1.1 {status} {reason}", "content-type: application/json",
             f"content-length: {len(content)}", *(f"{k}: {v}" for k, v in (headers or {}).items()),
             "connection: close", f"{name.decode()}: {value.decode()}",
             "x-content-type-options: nosniff"]  # fmt: skip
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + content


async def send(send: Any, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    """Sends an :class:`ErrorBody` answer on a raw ASGI ``send`` (for middleware)."""
    content = json.dumps(body(status, detail)).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(content))]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": content})


def statuses(operation: dict[str, Any]) -> set[int]:
    """The error statuses an operation can answer with, from what it takes."""
    declared = {int(s) for s in operation.get("responses", {}) if str(s).isdigit()}
    found = {500, 503} | {s for s in declared if s >= 400}
    if operation.get("security"):
        found |= {401, 403}
    if "requestBody" in operation:
        found |= {400, 408, 413, 415, 422}
    if operation.get("parameters"):
        found.add(422)
    return found


def add_errors(schema: dict[str, Any]) -> None:
    """Adds :class:`ErrorBody` and every operation's error statuses to an OpenAPI document."""
    models = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(models.pop("$defs", {}))
    components["ErrorBody"] = models
    content = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            for status in sorted(statuses(operation)):
                declared = responses.get(str(status), {})
                responses[str(status)] = {
                    "description": declared.get("description") or DESCRIPTIONS.get(status, "error"),
                    "content": content,
                }
    referenced = json.dumps(schema.get("paths", {}))
    for unused in ("HTTPValidationError", "ValidationError"):
        if f'/{unused}"' not in referenced:
            components.pop(unused, None)


__all__ = ["DESCRIPTIONS", "ErrorBody", "FieldError", "add_errors", "body", "send"]
