"""Structured logs: a JSON formatter, request ids, and the server's one-line-per-request access log.

Every HTTP request gets an id: the client's ``X-Request-ID`` when it is a short token
(:data:`REQUEST_ID_PATTERN`), else a fresh one. The id is echoed in the response, logged on the
access line, and held in :data:`request_id` for the request's duration, so every record logged
while serving it carries the id too (:class:`JsonFormatter` adds it).

Example:
    >>> import logging, sys
    >>> handler = logging.StreamHandler(sys.stdout)
    >>> handler.setFormatter(JsonFormatter(timestamps=False))
    >>> log = logging.getLogger("doc.example")
    >>> log.addHandler(handler); log.propagate = False
    >>> log.warning("slow lookup", extra={"duration_ms": 812.5})
    {"level": "WARNING", "logger": "doc.example", "message": "slow lookup", "duration_ms": 812.5}
"""

from __future__ import annotations

import json
import logging
import logging.config
import re
import uuid
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(levelname)s %(name)s: %(message)s"
REQUEST_ID_HEADER = "X-Request-ID"
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")

request_id: ContextVar[str | None] = ContextVar("tunecache_request_id", default=None)
"""The id of the request being served in this context (``None`` outside a request)."""

access_logger = logging.getLogger("cache_server.access")

# Attributes every LogRecord has; anything else on a record came from ``extra=``. Uvicorn adds
# ``color_message`` (the message with terminal colour codes), which has no place in JSON.
_LEFT_OUT = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message", "asctime", "taskName", "color_message",
}  # fmt: skip


class JsonFormatter(logging.Formatter):
    """Renders each record as one JSON object on one line.

    Keys: ``time`` (UTC, ISO 8601, milliseconds), ``level``, ``logger``, ``message``, the
    current :data:`request_id` when there is one, every field passed with ``extra=``, and
    ``exception`` / ``stack`` when the record has them. Values JSON cannot hold are written
    with ``str()``.

    Args:
        timestamps: Include ``time`` (leave it out for reproducible output, as in examples).
    """

    def __init__(self, *, timestamps: bool = True) -> None:
        super().__init__()
        self.timestamps = timestamps

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {}
        if self.timestamps:
            created = datetime.fromtimestamp(record.created, UTC)
            entry["time"] = created.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        entry["level"] = record.levelname
        entry["logger"] = record.name
        entry["message"] = record.getMessage()
        current = request_id.get()
        if current is not None:
            entry["request_id"] = current
        entry.update((key, value) for key, value in record.__dict__.items() if key not in _LEFT_OUT)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure(log_format: LogFormat = "text", *, verbose: bool = False) -> None:
    """Logs the server's records to stderr: its own and uvicorn's at INFO, others at WARNING.

    Replaces the root logger's handlers. Uvicorn must then be run with ``access_log=False`` (the
    access log is :func:`log_access`'s) and with ``log_config=None`` (so it keeps this set-up) or
    :func:`logging_config` (so each of its worker processes makes the same one).

    Args:
        log_format: ``"json"`` for one :class:`JsonFormatter` object per line, ``"text"`` for
            :data:`TEXT_FORMAT`.
        verbose: Log DEBUG records of every logger.
    """
    logging.config.dictConfig(logging_config(log_format, verbose=verbose))


def logging_config(log_format: LogFormat = "text", *, verbose: bool = False) -> dict[str, Any]:
    """:func:`configure`'s set-up as a :func:`logging.config.dictConfig` dictionary: uvicorn's
    ``log_config``, which it applies in each worker process it spawns (``--workers`` above 1),
    where what the parent configured does not reach."""
    if log_format == "json":
        formatter: dict[str, Any] = {"()": f"{__name__}.{JsonFormatter.__name__}"}
    else:
        formatter = {"format": TEXT_FORMAT}
    ours: dict[str, Any] = {
        "level": "DEBUG" if verbose else "INFO",
        "handlers": [],
        "propagate": True,
    }
    return {
        "version": 1,
        "disable_existing_loggers": False,  # the loggers modules made on import keep logging
        "formatters": {"server": formatter},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "server",
                                "stream": "ext://sys.stderr"}},
        "root": {"level": "DEBUG" if verbose else "WARNING", "handlers": ["stderr"]},
        "loggers": {"cache_server": dict(ours), "uvicorn": dict(ours)},
    }  # fmt: skip


def new_request_id(offered: str | None) -> str:
    """``offered`` when it is 1–64 characters of ``[A-Za-z0-9._-]``, else a fresh random id."""
    if offered is not None and REQUEST_ID_PATTERN.fullmatch(offered):
        return offered
    return uuid.uuid4().hex


def log_access(
    *, request_id: str, method: str, path: str, route: str, status: int, duration_ms: float
) -> None:
    """Logs one served request on ``cache_server.access`` (INFO), with its fields as extras.

    Args:
        request_id: The request's id (as echoed to the client).
        method: The HTTP method.
        path: The path as the client sent it (still percent-encoded; no query string).
        route: The route template that served it, or ``"unmatched"``.
        status: The response status (500 when the app failed before answering).
        duration_ms: Time from the request's arrival to the end of the response.
    """
    access_logger.info(
        "%s %s %d %.1fms id=%s",
        method,
        path,
        status,
        duration_ms,
        request_id,
        extra={
            "request_id": request_id,
            "method": method,
            "path": path,
            "route": route,
            "status": status,
            "duration_ms": round(duration_ms, 3),
        },
    )
