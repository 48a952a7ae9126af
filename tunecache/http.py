"""The HTTP pieces every API call shares: timeouts as deadlines, the server's identity, its error
answers, parsing answers.

A timeout here is a **deadline for the whole call**: connecting, sending, the status line, every
header and the last byte of the body. httpx's own timeouts are per operation, so a server that
sends one byte every 0.3 s would hold a "0.5 s" request for minutes; :class:`DeadlineTransport`
bounds every socket operation by the time left to the call (:func:`deadline`), so such a server
gets a timeout when the call's time is up.

An answer is bounded in bytes too (:func:`answer_limit`): what a call reads off the socket,
headers and body, stops with an error past its limit, and answers come unencoded (the client
asks for ``Accept-Encoding: identity`` and refuses any other), so a few kilobytes of nested gzip
cannot inflate into gigabytes in the caller's memory.

Example:
    >>> with deadline(0.5):  # every request made inside ends within 0.5 s from here
    ...     pass
    >>> Timeout(lookup=0.5).lookup
    0.5
"""

from __future__ import annotations

import contextlib
import contextvars
import ipaddress
import logging
import math
import random
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import httpcore
import httpx
from pydantic import BaseModel, ValidationError

from tunecache.backoff import backoff
from tunecache.errors import InvalidInput, ServerError
from tunecache.jsonsafe import parse_json, past_bound
from tunecache.settings import MAX_LOOKUP_TIMEOUT, without_userinfo
from tunecache.strict import SERVED, shown

M = TypeVar("M", bound=BaseModel)

# Every answer of a tunecache server carries this header (its value: ``tunecache/<version>``).
# A 404 without it came from something else: a wrong URL, a proxy, another web server.
IDENTITY_HEADER = "Tunecache-Server"
BAD_ANSWER_CHARS = 200  # of a bad answer's first error, in the one-line message
DETAIL_CHARS = 300  # of an error answer's text shown in an error
WRITE_CHUNK = 64 * 1024  # bytes a socket write sends under one bound
# Bytes one call may read, headers and body: a lookup's answer is one record without its trials
# (its config at most 256 KiB, its checks at most 256), so it parses well within a lookup's
# time; any other answer (a record's trials, a page of artifacts, a snapshot of 50,000 records).
LOOKUP_ANSWER_BYTES = 2 * 1024 * 1024
# JSON arrays and objects a lookup answer may hold: a record's largest config (a MetaSchedule
# trace of 4,096 instructions, about 4.5 containers each) with room to spare.
LOOKUP_ANSWER_CONTAINERS = 65_536
MAX_ANSWER_BYTES = 256 * 1024 * 1024
# Bytes an answer of one small object may read (an upload's result, a job, a token, whoami): a
# hostile server's 64 MiB claim answer took a daemon from 453 MB to 1.83 GB before it was refused.
SMALL_ANSWER_BYTES = 1024 * 1024
# An error answer read as JSON: a 422 naming every error of a large upload fits; a 500 of 256 MiB
# of empty lists, parsed unbounded, would have held tens of GB (read as text past these).
ERROR_ANSWER_BYTES = 1024 * 1024
ERROR_ANSWER_CONTAINERS = 65_536

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "tunecache_deadline", default=None
)
# [limit, bytes left] of each answer limit in force, outermost first
_BUDGETS: contextvars.ContextVar[tuple[list[int], ...]] = contextvars.ContextVar(
    "tunecache_answer_limits", default=()
)


@dataclass(frozen=True)
class Timeout:
    """Seconds a whole call may take: ``lookup`` for run-time reads (lookups, miss reports,
    disputes), ``write`` for every other call; ``connect`` bounds connecting within either
    (default: ``lookup`` for reads, at most 5 s for writes)."""

    lookup: float = 0.5
    connect: float | None = None
    write: float = 60.0

    def __post_init__(self) -> None:
        """Each a float: any number (numpy's, ``Decimal``) that is positive and finite; not a
        flag, nor text (``"x"`` raised ``float()``'s own message, naming nothing; ``True`` was
        taken for one second); ``lookup`` and ``connect`` at most :data:`MAX_LOOKUP_TIMEOUT`
        (``Client(url, timeout=500)``, milliseconds meant, held each lookup of a silent server
        8 minutes, where ``TUNECACHE_TIMEOUT=500`` was refused).

        Raises:
            InvalidInput: a bound that is none of these, named (a ``ValueError``).
        """
        for name in ("lookup", "connect", "write"):
            value = getattr(self, name)
            if value is None:
                continue
            try:
                seconds = -1.0 if isinstance(value, bool | str | bytes) else float(value)
            except (TypeError, ValueError):
                seconds = -1.0
            if not (math.isfinite(seconds) and seconds > 0):
                raise InvalidInput(f"Timeout.{name} (a client's timeout=) must be a positive "
                                   f"number of seconds: {value!r}")  # fmt: skip
            if name != "write" and seconds > MAX_LOOKUP_TIMEOUT:
                raise InvalidInput(f"Timeout.{name} (a client's timeout=) must be at most "
                                   f"{MAX_LOOKUP_TIMEOUT:g} seconds: {value!r} (it is in "
                                   "seconds: 0.5 is half a second)")  # fmt: skip
            object.__setattr__(self, name, seconds)

    def per_operation(self, seconds: float, *, read: bool) -> httpx.Timeout:
        """httpx's per-operation limits for a call of ``seconds`` (the deadline bounds the sum)."""
        connect = self.connect or (seconds if read else min(seconds, 5.0))
        return httpx.Timeout(seconds, connect=min(connect, seconds))


@contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Every request made inside (through a :class:`DeadlineTransport`) ends within ``seconds``
    from now, or within an enclosing deadline if that one ends first. ``None``: no new bound."""
    if seconds is None:
        yield
        return
    end = time.monotonic() + seconds
    outer = _DEADLINE.get()
    token = _DEADLINE.set(end if outer is None else min(outer, end))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


@contextmanager
def answer_limit(max_bytes: int) -> Iterator[list[int]]:
    """The requests made inside (through a :class:`DeadlineTransport`) read at most
    ``max_bytes`` off their sockets in all, and within any enclosing limit; past them the read
    fails (``httpx.ReadError``). Yields ``[max_bytes, bytes left]``: below 0, this limit failed
    the read (not an enclosing one, nor the server)."""
    budget = [max_bytes, max_bytes]
    token = _BUDGETS.set((*_BUDGETS.get(), budget))
    try:
        yield budget
    finally:
        _BUDGETS.reset(token)


def _spend(read: int) -> None:
    for budget in _BUDGETS.get():
        budget[1] -= read
        if budget[1] < 0:
            raise httpcore.ReadError(f"the answer is over {budget[0]:,} bytes")


def time_left() -> float | None:
    """Seconds left to the current deadline (``None``: none is set)."""
    end = _DEADLINE.get()
    return None if end is None else end - time.monotonic()


def _bounded(timeout: float | None, error: type[Exception]) -> float | None:
    """``timeout``, cut to the time left to the deadline; ``error`` when none is left."""
    left = time_left()
    if left is None:
        return timeout
    if left <= 0:
        raise error("the call's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A socket whose every read and write waits no longer than the call has left."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = self._stream.read(max_bytes, _bounded(timeout, httpcore.ReadTimeout))
        _spend(len(data))
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        # In pieces: a socket write waits its timeout per send(), and a reader that drains a
        # byte at a time would otherwise stretch one write past the deadline.
        for start in range(0, len(buffer), WRITE_CHUNK):
            piece = buffer[start : start + WRITE_CHUNK]
            self._stream.write(piece, _bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:  # fmt: skip
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, bounded))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _resolve(host: str, port: int, seconds: float | None) -> list[str]:
    """``host``'s addresses, looked up in a daemon thread and waited for ``seconds`` at most
    (a hung resolver keeps its thread, never the caller nor the interpreter's exit)."""
    found: list[Any] = []
    done = threading.Event()

    def lookup() -> None:
        try:
            found.extend(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            found.append(exc)
        finally:
            done.set()

    threading.Thread(target=lookup, daemon=True, name="tunecache-resolve").start()
    if not done.wait(seconds):
        raise httpcore.ConnectTimeout(f"looking up {host} took longer than the call's time")
    if found and isinstance(found[0], OSError):
        raise httpcore.ConnectError(f"looking up {host} failed: {found[0]}")
    return list(dict.fromkeys(str(info[4][0]) for info in found))


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's socket backend, with every operation bounded by the call's deadline."""

    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(
        self, host: str, port: int, timeout: float | None = None,
        local_address: str | None = None, socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:  # fmt: skip
        if time_left() is None or _is_address(host):
            bounded = _bounded(timeout, httpcore.ConnectTimeout)
            stream = self._backend.connect_tcp(host, port, bounded, local_address, socket_options)
            return _DeadlineStream(stream)
        # The name lookup has no timeout of its own, and each address would get the whole one:
        # resolve within the time left, then try each address within what is left after.
        addresses = _resolve(host, port, _bounded(timeout, httpcore.ConnectTimeout))
        failed: Exception | None = None
        for address in addresses:
            bounded = _bounded(timeout, httpcore.ConnectTimeout)
            try:
                stream = self._backend.connect_tcp(address, port, bounded, local_address,
                                                   socket_options)  # fmt: skip
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failed = exc
                continue
            return _DeadlineStream(stream)
        raise failed or httpcore.ConnectError(f"{host} has no address")

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None
                            ) -> httpcore.NetworkStream:  # fmt: skip
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_unix_socket(path, bounded, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's transport over sockets bounded by :func:`deadline` (see the module doc).

    Args:
        **options: as :class:`httpx.HTTPTransport`.
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        pool = self._pool
        if not hasattr(pool, "_network_backend"):  # pragma: no cover - an httpcore we don't know
            raise RuntimeError("this httpcore does not take a network backend: pin httpcore<2")
        pool._network_backend = _DeadlineBackend()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """The answer, refused if encoded: its decoded size would escape :func:`answer_limit`
        (a 204 or 304 has no body to decode: a proxy may repeat the header on them)."""
        response = super().handle_request(request)
        coding = response.headers.get("content-encoding", "identity").strip().lower()
        if coding not in ("", "identity") and response.status_code not in (204, 304):
            response.close()
            raise httpx.DecodingError(f"the answer is encoded ({coding[:40]}), though the "
                                      "request asked for none (Accept-Encoding: identity)",
                                      request=request)  # fmt: skip
        return response


def proxy_mounts() -> dict[str, httpx.BaseTransport | None]:
    """Transports for the proxies the environment names (``HTTP(S)_PROXY``, ``ALL_PROXY``,
    ``NO_PROXY``), each bounded by :func:`deadline` like the direct one; as httpx reads them."""
    try:
        from httpx._utils import get_environment_proxies  # httpx's own reading of them
    except ImportError:  # pragma: no cover - an httpx that moved it: no proxies then
        return {}
    mounts: dict[str, httpx.BaseTransport | None] = {}
    for pattern, url in get_environment_proxies().items():
        try:
            mounts[pattern] = None if url is None else DeadlineTransport(proxy=url)
        except (ImportError, ValueError, httpx.InvalidURL) as exc:  # no socksio, a bad URL
            shown = without_userinfo(url or "")  # a proxy's credentials stay out of the log
            logging.getLogger(__name__).warning("not using proxy %s: %s", shown, exc)
    return mounts


def error_json(response: httpx.Response) -> Any:
    """An error answer's body as JSON, within :data:`ERROR_ANSWER_BYTES` and
    :data:`ERROR_ANSWER_CONTAINERS` (an error answer was parsed with no bound: a hostile 404 of
    2 MiB of empty lists took seconds of a lookup's half second).

    Raises:
        ValueError: not JSON, or past those bounds.
    """
    body = response.content
    if len(body) > ERROR_ANSWER_BYTES or past_bound(body, ERROR_ANSWER_CONTAINERS):
        raise ValueError("an error answer too large to read as JSON")
    return parse_json(body)


def is_tunecache(response: httpx.Response) -> bool:
    """Whether the answer came from a tunecache server: it carries :data:`IDENTITY_HEADER`, or
    (a server from before the header, or an error answered past the middleware that adds it)
    it is an error in tunecache's one shape, ``{"status": <its status>, "detail": "…", …}``."""
    if response.headers.get(IDENTITY_HEADER, "").startswith("tunecache/"):
        return True
    if not response.is_error or "json" not in response.headers.get("content-type", ""):
        return False
    try:
        body = error_json(response)
    except ValueError:
        return False
    return (isinstance(body, dict) and body.get("status") == response.status_code
            and isinstance(body.get("detail"), str))  # fmt: skip


def missing(response: httpx.Response) -> bool:
    """Whether ``response`` is a tunecache server saying the thing asked for is not there (a
    404 with its identity, for a path it has)."""
    return response.status_code == 404 and is_tunecache(response) and not no_route(response)


def no_route(response: httpx.Response) -> bool:
    """Whether a tunecache server's 404 says no route has the path asked (the framework's own
    ``Not Found``), not that the thing asked for is missing: a URL with a path in it
    (``http://host:8765/v1``) answers every call so, and a lookup would read it as a miss."""
    if response.status_code != 404:
        return False
    try:
        body = error_json(response)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("detail") == "Not Found"


def rejected(method: str, path: str, response: httpx.Response) -> ServerError:
    """The server's error answer as a :class:`ServerError` carrying its status and reason (one
    line: an answer that is not tunecache's, such as an HTML page, is named as such)."""
    status = response.status_code
    if not is_tunecache(response):
        where = response.url.netloc.decode("ascii", "replace")  # host, and its port if named
        return ServerError(
            f"{method} {path} → {status} from {where}, which is "
            f"not a tunecache server (no {IDENTITY_HEADER} header): is the URL right?",
            status_code=status,
            foreign=True,
        )
    if no_route(response):
        asked = response.url.path
        extra = asked[: -len(path)] if asked.endswith(path) and asked != path else ""
        hint = (f"is the server URL its root (such as http://host:8765, without {extra})?"
                if extra else "a server older than this client?")  # fmt: skip
        return ServerError(f"{method} {response.url.copy_with(query=None)} → 404: the tunecache "
                           f"server there has no such path: {hint}", status_code=404,
                           no_route=True)  # fmt: skip
    # The body as UTF-8, whatever charset the answer names: httpx decodes ``.text`` with any
    # codec Python has, and "charset=hex" (a bytes codec) raised AssertionError into user code.
    text = response.content[: DETAIL_CHARS * 16].decode("utf-8", "replace")  # its start is shown
    try:
        detail = str(error_json(response).get("detail", text))
    except (ValueError, AttributeError):
        detail = text
    lines = [line.strip() for line in detail.splitlines() if line.strip()]
    said = shown(lines[0][:DETAIL_CHARS]) if lines else ""  # logged: no terminal controls
    return ServerError(f"{method} {path} → {status}: {said}", status_code=status,
                       retry_after=retry_after(response))  # fmt: skip


def shed_wait(response: httpx.Response, sent: int = 1) -> float | None:
    """How long to wait before sending again a request a tunecache server shed (503 with
    ``Retry-After``) after it was sent ``sent`` times: what it asks, but at least 0.1 s doubled
    for each time sent before (a server asking for 0 s got 34 requests in a 2 s read), with
    jitter; ``None``: not such an answer."""
    if response.status_code != 503 or not is_tunecache(response):
        return None
    asked = retry_after(response)
    return None if asked is None else max(asked, backoff(sent)) * random.uniform(1.0, 1.25)


def refuses_field(response: httpx.Response, field: str) -> bool:
    """Whether ``response`` is a tunecache server's 422 refusing the body's ``field`` as
    unknown: a server older than the field (its errors name it ``body.FIELD``)."""
    if response.status_code != 422 or not is_tunecache(response):
        return False
    with contextlib.suppress(ValueError, AttributeError, TypeError, KeyError):
        errors = error_json(response)["errors"]
        return any(e["loc"] == ["body", field] and e["type"] == "extra_forbidden" for e in errors)
    return False


def retry_after(response: httpx.Response) -> float | None:
    """The seconds a ``Retry-After`` header asks for (a number of seconds, at most an hour)."""
    try:
        seconds = float(response.headers.get("retry-after", ""))
    except ValueError:
        return None
    return seconds if 0 <= seconds <= 3600 else None


def foreign(response: httpx.Response, path: str) -> ServerError:
    """The error for a success answer of ``path`` that is not a tunecache server's (no
    :data:`IDENTITY_HEADER`, and not what the call answers): a URL pointing elsewhere."""
    where = response.url.netloc.decode("ascii", "replace")  # host, and its port if named
    return ServerError(
        f"{path}: {where} answered, but is not a tunecache "
        f"server (no {IDENTITY_HEADER} header): is the URL right?",
        status_code=response.status_code,
        foreign=True,
    )


# Errors of a bad answer worth listing to find the first: pydantic lists them all, 4.6 s for a
# million (a list of a million numbers where records belong, were its length not bounded).
LISTED_ERRORS = 10_000


def first_error(exc: ValidationError) -> str:
    """The first of ``exc``'s errors in a line, with their count; its location may hold the
    server's own keys: quoted, cut."""
    count = exc.error_count()
    if count > LISTED_ERRORS:
        return f"{count:,} errors against {exc.title}"
    first = exc.errors(include_url=False)[0]
    where = ".".join(repr(p) if isinstance(p, str) else str(p) for p in first["loc"])
    said = shown(f"{first['msg']} at {where or 'the body'}".replace("\n", " "))
    return f"{said[:BAD_ANSWER_CHARS]} ({count} error(s))"


def parse(model: type[M], response: httpx.Response, path: str, *,
          max_containers: int | None = None, max_values: int | None = None,
          counted: tuple[int, int] | None = None) -> M:  # fmt: skip
    """The answer of ``path`` as ``model``, read within the call's deadline (:func:`deadline`)
    where one is set: parsing and checking an answer is part of the call.

    Args:
        max_containers: at most this many JSON arrays and objects in the answer, counted before
            it is parsed (its strings left out). Building a Python object costs far more than
            reading its two bytes: a 2 MiB answer of empty lists took a second to parse and check.
        max_values, counted: as :func:`~tunecache.jsonsafe.past_bound`'s.

    Raises:
        ServerError: the answer is not a valid ``model`` (a broken or hostile server), holds
            more containers than ``max_containers``, or was read past the deadline.
    """
    body, most = response.content, max_containers
    if most is not None and (past := past_bound(body, most, max_values, counted=counted)):
        if not is_tunecache(response):
            raise foreign(response, path)
        raise ServerError(f"{path} gave a bad answer: {past}")
    try:
        parsed = model.model_validate_json(body, context=SERVED)
    except ValidationError as exc:
        if not is_tunecache(response):
            raise foreign(response, path) from exc
        raise ServerError(f"{path} gave a bad answer: {first_error(exc)}") from exc
    if (left := time_left()) is not None and left < 0:
        raise ServerError(f"{path}: reading the answer took {-left:.2f} s past the call's "
                          f"deadline")  # fmt: skip
    return parsed


def tls_hint(exc: Exception) -> str:
    """What a failed call's message adds when an ``https://`` URL met a server speaking plain
    HTTP (OpenSSL's "wrong version number", which said nothing of the URL), else nothing."""
    if "WRONG_VERSION_NUMBER" in str(exc) or "wrong version number" in str(exc):
        return " (the server there speaks plain HTTP: use an http:// URL)"
    return ""
