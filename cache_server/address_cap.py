"""At most ``max_connections`` open connections from one client address to one server process.

Without it, one client could open connections until the server process ran out of file
descriptors (1,024 by default) and could accept no one else's: each idle one lasts until its
headers are late (:mod:`cache_server.header_deadline`), and a client opening them faster than
that holds as many as it likes. Beyond the cap a connection is answered at once with a 429 in the
API's error shape, with ``Retry-After``, and closed; the other addresses' connections are not
touched. Behind a proxy every client has the proxy's address: raise the cap there
(``TUNECACHE_SERVER_MAX_CONNECTIONS_PER_ADDRESS``), and let the proxy cap its clients.

A client with several addresses (any local user has all of 127/8) held 256 from each of four and
the server, at the usual 1,024 descriptors, answered no one else. So the process holds at most
``max_connections`` in all (``TUNECACHE_SERVER_MAX_CONNECTIONS``; by default its open-file limit,
raised to the hard limit as it starts, less :data:`RESERVED` for its files), and the last
:data:`FEW_RESERVE` of them only for addresses holding fewer than :data:`FEW`: a client holding
many is refused first (503), one with a connection or two still gets in.
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
RESERVED: Final = 128  # descriptors kept for the process's own files (database, logs, metrics)
FEW: Final = 2  # connections of an address that still gets one of the last FEW_RESERVE
FEW_RESERVE: Final = 64
WANTED_FILES: Final = 65_536  # the open-file limit a server process raises its own to, at most
FULL: Final = 503


class AddressCap:
    """The open connections of each address in this process, and the caps on them: ``limit``
    per address, ``total`` in all."""

    def __init__(self, limit: int, total: int | None = None) -> None:
        self.limit = limit
        most = connections_limit()  # the open-file limit raised: a total given never passes it
        self.total = most if total is None else min(total, most)
        self._open: Counter[str] = Counter()
        self._held = 0  # the sum of _open and _lingering: every counted descriptor
        self._lingering: Counter[str] = Counter()

    def admit(self, address: str) -> bool:
        """Counts a new connection from ``address``; ``False`` (and not counted) when it already
        has ``limit`` open, or the process is full for it (:meth:`full_for`)."""
        if self._open[address] >= self.limit or self.full_for(address):
            return False
        self._open[address] += 1
        self._held += 1
        return True

    def full_for(self, address: str) -> bool:
        """Whether the process holds too many connections in all to take one more of
        ``address``: ``total``, or the last :data:`FEW_RESERVE` of them where ``address`` holds
        :data:`FEW` or more."""
        reserve = min(FEW_RESERVE, self.total // 4)
        return self._held >= self.total or (
            self._held >= self.total - reserve and self._open[address] >= FEW
        )

    def release(self, address: str, *, refused: bool = False) -> None:
        """Counts a connection of ``address`` as closed: an admitted one, or a ``refused`` one
        that :meth:`linger` let linger."""
        counts = self._lingering if refused else self._open
        counts[address] -= 1
        self._held -= 1
        if counts[address] <= 0:
            del counts[address]

    def linger(self, address: str) -> bool:
        """Whether a refused connection of ``address`` may stay open a moment (counted until
        released), or must be closed at once."""
        if self._lingering[address] >= LINGERING or self._held >= self.total:
            return False
        self._lingering[address] += 1
        self._held += 1
        return True

    def refusal(self, retry_after: int, address: str) -> bytes:
        """The raw HTTP answer to a connection of ``address`` refused by :meth:`admit` (it is
        closed after it): 429 over its own cap, 503 when the process is full for it."""
        after = {"retry-after": str(retry_after)}
        if self._open[address] >= self.limit:
            detail = (f"more than {self.limit} connections from this address are open to this "
                      "server process: close some, or reuse them (one client, one connection "
                      "pool)")  # fmt: skip
            return raw_answer(STATUS, "Too Many Requests", detail, after)
        held = self._open[address]
        detail = (f"this server process is full ({self._held} of its {self.total} connections "
                  f"held), {held} of them from this address: close some, or retry")  # fmt: skip
        return raw_answer(FULL, "Service Unavailable", detail, after)


def open_files() -> int:
    """This process's open-file limit, first raised toward its hard limit (to
    :data:`WANTED_FILES` at most) where the soft one is lower: the usual soft 1,024 is a few
    clients' worth. Where it cannot be read (no ``resource`` module), :data:`WANTED_FILES`."""
    try:
        import resource
    except ImportError:  # not POSIX
        return WANTED_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = WANTED_FILES if hard == resource.RLIM_INFINITY else min(hard, WANTED_FILES)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):  # not allowed here: keep the soft limit
            pass
    return WANTED_FILES if soft == resource.RLIM_INFINITY else soft


def connections_limit() -> int:
    """The connections a server process may hold in all by default: its open-file limit
    (:func:`open_files`) less :data:`RESERVED` for its own files, at least 16."""
    return max(16, open_files() - RESERVED)
