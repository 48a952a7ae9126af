"""At most ``max_connections`` open connections from one client address to one server process.

Without it, one client could open connections until the server process ran out of file
descriptors (1,024 by default) and could accept no one else's: each idle one lasts until its
headers are late (:mod:`cache_server.header_deadline`), and a client opening them faster than
that holds as many as it likes. Beyond the cap a connection is answered at once with a 429 in the
API's error shape, with ``Retry-After``, and closed; the other addresses' connections are not
touched. Behind a proxy every client has the proxy's address: raise the cap there
(``TUNECACHE_SERVER_MAX_CONNECTIONS_PER_ADDRESS``), and let the proxy cap its clients.
"""

from __future__ import annotations

from collections import Counter
from typing import Final

from cache_server.api.problems import raw_answer

STATUS: Final = 429
# Refused connections of one address kept open a moment for their answer to be read (see
# HeaderDeadline._refuse); beyond these, one is closed at once: a client hammering the server
# with connections holds no more descriptors than this for it.
LINGERING: Final = 8


class AddressCap:
    """The open connections of each address in this process, and the cap on them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: Counter[str] = Counter()
        self._lingering: Counter[str] = Counter()

    def admit(self, address: str) -> bool:
        """Counts a new connection from ``address``; ``False`` (and not counted) when it already
        has ``limit`` open."""
        if self._open[address] >= self.limit:
            return False
        self._open[address] += 1
        return True

    def release(self, address: str, *, refused: bool = False) -> None:
        """Counts a connection of ``address`` as closed: an admitted one, or a ``refused`` one
        that :meth:`linger` let linger."""
        counts = self._lingering if refused else self._open
        counts[address] -= 1
        if counts[address] <= 0:
            del counts[address]

    def linger(self, address: str) -> bool:
        """Whether a refused connection of ``address`` may stay open a moment (counted until
        released), or must be closed at once."""
        if self._lingering[address] >= LINGERING:
            return False
        self._lingering[address] += 1
        return True

    def refusal(self, retry_after: int) -> bytes:
        """The raw HTTP answer to a connection over the cap (it is closed after it)."""
        detail = (
            f"more than {self.limit} connections from this address are open to this server "
            "process: close some, or reuse them (one client, one connection pool)"
        )
        return raw_answer(STATUS, "Too Many Requests", detail, {"retry-after": str(retry_after)})
