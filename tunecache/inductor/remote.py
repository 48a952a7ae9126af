"""The team cache as the Inductor integration sees it: bounded reads that never raise.

:class:`TeamCache` wraps one :class:`tunecache.Client` for one partition. A read that fails
(server down, timeout, 401/403, a bad answer) warns once (``TeamCacheWarning``) and marks the
server down for the rest of the process, so a dead server costs one lookup timeout in all, not one
per kernel; a server shedding load (503) is asked again within the read's timeout where its
``Retry-After`` allows first: one shed read left a rank benchmarking on its own. Writes
(:meth:`TeamCache.put`) raise :class:`tunecache.errors.ServerError`: the callers that write
(``tune --torch``, :func:`tunecache.inductor.upload`) decide what to do.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import Any

from tunecache.artifacts import ArtifactIn, ArtifactPublic, ArtifactPutResult, Namespace
from tunecache.client import Client
from tunecache.http import Timeout

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 2.0
MAX_ITEMS = 20_000  # artifacts one partition read takes: a bound on a hostile answer's size


class TeamCacheWarning(UserWarning):
    """The team cache could not be read; Inductor autotunes on its own."""


class TeamCache:
    """One server and one partition; reads fall back to nothing after one warning.

    Args:
        url: the server; ``TUNECACHE_URL`` when ``None``.
        token: the API token; ``TUNECACHE_TOKEN`` when ``None``.
        partition: the partition (:func:`tunecache.inductor.partition.partition`).
        timeout: seconds each read request may take (connecting included; at most 60).
        write: seconds an upload may take (default: ``timeout``, at least 30).

    Raises:
        ValueError: a ``TUNECACHE_*`` variable has a bad value (see :mod:`tunecache.settings`),
            or a timeout is not a positive number of seconds (``timeout`` at most 60).
    """

    def __init__(
        self, url: str | None, token: str | None, partition: str, *, timeout: float,
        write: float | None = None,
    ) -> None:  # fmt: skip
        self.partition = partition
        self.timeout = timeout
        self.down = False
        writes = max(30.0, timeout) if write is None else write
        self.client = Client(url, timeout=Timeout(lookup=timeout, write=writes), token=token)

    @property
    def url(self) -> str:
        return self.client.url

    def fetch(self, namespace: Namespace, *, key: str | None = None) -> list[ArtifactPublic]:
        """The partition's artifacts of ``namespace`` (of one ``key``); ``[]`` on any failure."""
        if self.down:
            return []
        limit = 1 if key is not None else MAX_ITEMS
        try:  # a shed page is asked again within the timeout (Client.get_artifacts)
            return self.client.get_artifacts(
                namespace, self.partition, key=key, limit=limit, timeout=self.timeout
            )
        except Exception as exc:  # ServerError, or anything the HTTP stack let through: a
            # failure here would end the user's compile (as in tunecache.tvm.remote)
            self.fail(f"reading {namespace} from {self.url} failed ({exc})")
            return []

    def put(self, items: Sequence[ArtifactIn]) -> ArtifactPutResult:
        """Stores ``items`` on the server.

        Raises:
            ServerError: the server is unreachable or refused them.
        """
        return self.client.put_artifacts(items)

    def artifact(
        self, namespace: Namespace, key: str, value: dict[str, Any], score: float | None
    ) -> ArtifactIn:
        """An artifact of this partition."""
        return ArtifactIn(namespace=namespace, partition=self.partition, key=key, value=value,
                          score=score)  # fmt: skip

    def fail(self, why: str) -> None:
        """Marks the server down for this process and warns, the first time only."""
        if self.down:
            return
        self.down = True
        warnings.warn(
            f"tunecache: {why}; Inductor autotunes on its own", TeamCacheWarning, stacklevel=3
        )

    def close(self) -> None:
        self.client.close()
