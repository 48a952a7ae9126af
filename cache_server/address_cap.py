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

import json
from collections import Counter
from typing import Final

from cache_server.api.identity import IDENTITY
from cache_server.api.problems import body

STATUS: Final = 429


class AddressCap:
    """The open connections of each address in this process, and the cap on them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: Counter[str] = Counter()

    def admit(self, address: str) -> bool:
        """Counts a new connection from ``address``; ``False`` (and not counted) when it already
        has ``limit`` open."""
        if self._open[address] >= self.limit:
            return False
        self._open[address] += 1
        return True

    def release(self, address: str) -> None:
        """Counts an admitted connection of ``address`` as closed."""
        self._open[address] -= 1
        if self._open[address] <= 0:
            del self._open[address]

    def refusal(self, retry_after: int) -> bytes:
        """The raw HTTP answer to a connection over the cap (it is closed after it)."""
        detail = (
            f"more than {self.limit} connections from this address are open to this server "
            "process: close some, or reuse them (one client, one connection pool)"
        )
        content = json.dumps(body(STATUS, detail)).encode()
        name, value = IDENTITY
        head = (
            f"HTTP/1.1 {STATUS} Too Many Requests\r\ncontent-type: application/json\r\n"
            f"content-length: {len(content)}\r\nretry-after: {retry_after}\r\n"
            f"connection: close\r\n{name.decode()}: {value.decode()}\r\n\r\n"
        )
        return head.encode() + content
