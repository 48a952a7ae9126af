"""The server side of :class:`tunecache.tvm.Database`: artifact reads and writes that never raise.

MetaSchedule calls the database from C++ in the middle of ``tune_tir`` and ``compile_tir``; an
exception there would end the user's tuning or compilation. So every failure is answered here with
"nothing" and logged once, as a warning; after a failure that will not mend by itself (no
connection, a timeout, 401/403, a server error) the database stops asking for the rest of its life,
so a dead server costs one timeout, not one per call. A server that sheds load or is briefly
unavailable (503, 429) is asked again within the read's timeout where its ``Retry-After`` allows
(:meth:`tunecache.Client.get_artifacts`), then skipped for the ``Retry-After`` (at most
:data:`MAX_PAUSE` seconds) and asked again: one shed read made a process build TVM's default
schedule for good. The pause is at least a second, doubled past that for each shed call in a
row (:func:`tunecache.backoff.backoff`): a server shedding every call near the timeout with
``Retry-After: 0`` was asked each second of a compile, each call waiting for it. A write refused
for the token (401/403: a read-only token) stops the writes only; a refused single write (422:
an item the server will not take) only loses that item. A server that says it serves none of
this token's items (its verified policy, a token not trusted) is not written to again, once said.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from tunecache.artifacts import UNSERVED_NOTE, ArtifactIn, ArtifactPublic, Namespace
from tunecache.backoff import backoff
from tunecache.client import Client
from tunecache.errors import ServerError
from tunecache.http import Timeout

logger = logging.getLogger(__name__)

WRITE_TIMEOUT = 10.0  # seconds a write may take (reads get the lookup timeout)
_STAYS_DOWN = frozenset({401, 403, 404, 405})
_PAUSES = frozenset({429, 503})  # asked again after its Retry-After
MAX_PAUSE = 60.0  # seconds, whatever Retry-After a server names


class Remote:
    """A :class:`~tunecache.client.Client` for one partition that logs failures instead of raising.

    Args:
        url: the server; ``TUNECACHE_URL`` when ``None``.
        token: the API token; ``TUNECACHE_TOKEN`` when ``None``.
        timeout: seconds a read may take (connecting included); writes get at least
            :data:`WRITE_TIMEOUT`.
        partition: the partition every call reads or writes.
    """

    def __init__(self, url: str | None, token: str | None, timeout: float, partition: str) -> None:
        limits = Timeout(lookup=timeout, connect=timeout, write=max(timeout, WRITE_TIMEOUT))
        self.client = Client(url, timeout=limits, token=token)
        self.timeout = timeout
        self.partition = partition
        self.down: str | None = None  # why the server is no longer asked
        self.read_only: str | None = None  # why it is no longer written to (a 401/403 on writes)
        self.paused_until = 0.0  # time.monotonic() before which a shedding server is not asked
        self._shed = 0  # calls shed in a row: each pause past the first few is twice as long
        self._warned = False

    def _skipped(self) -> bool:
        return self.down is not None or time.monotonic() < self.paused_until

    def get(self, namespace: Namespace, key: str | None,
            limit: int) -> list[ArtifactPublic] | None:  # fmt: skip
        """The partition's ``namespace`` items (of ``key``: best score first); ``None`` when the
        server did not answer (down, paused, or the call failed): nothing to keep as its answer."""
        if self._skipped():
            return None
        try:  # a shed page is asked again within the timeout (Client.get_artifacts)
            items = self.client.get_artifacts(
                namespace, self.partition, key=key, limit=limit, timeout=self.timeout
            )
        except Exception as exc:  # ServerError, or anything the HTTP stack let through
            self._failed(f"reading {namespace}", _as_server_error(exc))
            return None
        self._shed = 0
        return items

    def put(self, items: Sequence[ArtifactIn]) -> bool:
        """Stores ``items``; whether the server took them (``False``: logged, kept local)."""
        if self._skipped() or self.read_only is not None or not items:
            return False
        try:
            result = self.client.put_artifacts(items)
        except Exception as exc:
            error = _as_server_error(exc)
            if error.status_code in (401, 403):  # a read-only token: reads still work
                self.read_only = str(error)
            self._failed(f"writing {len(items)} {items[0].namespace} item(s)", error, write=True)
            return False
        self._shed = 0
        if result.served is False:  # stored for nothing: its quota is not spent on more
            self.read_only = UNSERVED_NOTE
            logger.warning("tunecache.tvm: %s: %s; not writing to it from now on",
                           self.client.url, UNSERVED_NOTE)  # fmt: skip
        return True

    def close(self) -> None:
        self.client.close()

    def _failed(self, what: str, exc: ServerError, *, write: bool = False) -> None:
        code = exc.status_code
        refused_write = write and code in (401, 403)
        paused = code in _PAUSES
        stays_down = not refused_write and not paused and (
            code is None or code in _STAYS_DOWN or code >= 500)  # fmt: skip
        self._shed += paused
        pause = min(MAX_PAUSE, max(1.0, exc.retry_after or 1.0, backoff(self._shed)))
        if stays_down:
            self.down = str(exc)
        elif paused:
            self.paused_until = time.monotonic() + pause
        if not self._warned or stays_down:  # a pause's warning never hides the server's end
            self._warned = True
            then = "skipped"
            if stays_down:
                then = "using local records only from now on"
            elif paused:
                then = f"asking it again in {pause:.0f} s"
            elif refused_write:
                then = "not writing to it from now on"
            logger.warning(
                "tunecache.tvm: %s at %s failed (%s); %s", what, self.client.url, exc, then
            )
        else:
            logger.debug("tunecache.tvm: %s failed: %s", what, exc)


def _as_server_error(exc: Exception) -> ServerError:
    """``exc`` itself when it is a :class:`ServerError`, else one without a status (stays down)."""
    if isinstance(exc, ServerError):
        return exc
    return ServerError(f"{type(exc).__name__}: {exc}")
