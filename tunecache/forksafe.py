"""Each process its own connections: a client made before a fork is renewed in the child.

A forked child (multiprocessing's ``fork`` context, a DataLoader's workers) inherits its
parent's keep-alive sockets. A parent that had looked a key up, and its four forked workers,
all wrote their requests onto that one socket: the answers crossed ("not a tunecache server",
``RemoteProtocolError``), every process got the default config and skipped the server for 30 s.

So, right after a fork, in the child, every live client (:func:`track`) is renewed: a new pool
of connections (:func:`connect`) and a new server source (its background thread did not survive
the fork, and a lock or lookup slot a parent thread held then would be held for good). What the
child inherited is left alone, never closed: closing a TLS connection sends its peer a
``close_notify`` on the parent's stream. A transport the caller gave the client is kept: it is
the caller's to make fork-safe.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Protocol

import httpx

from tunecache.errors import one_line
from tunecache.http import DeadlineTransport, proxy_mounts
from tunecache.resolver import Resolver, Source

logger = logging.getLogger(__name__)


class Renewable(Protocol):
    """What :func:`track` takes: an object with its own per-process state."""

    def renew_after_fork(self) -> None:
        """Runs in a forked child, alone (no other thread runs yet); must not raise."""


_LIVE: weakref.WeakSet[Renewable] = weakref.WeakSet()
_LOCK = threading.Lock()  # held across a fork: the child's set is never half-changed


def track(renewable: Renewable) -> None:
    """Renews ``renewable`` in each child this process forks from now on, while it lives."""
    with _LOCK:
        _LIVE.add(renewable)


def forget(renewable: Renewable) -> None:
    """Stops renewing ``renewable`` (closed: a child has nothing to renew)."""
    with _LOCK:
        _LIVE.discard(renewable)


def connect(url: str, transport: httpx.BaseTransport | None,
            headers: dict[str, str]) -> httpx.Client:  # fmt: skip
    """A new pool of connections to ``url``: through ``transport`` (tests give an in-memory
    one), else sockets bounded by deadlines, proxies from the environment included."""
    mounts = proxy_mounts() if transport is None else {}
    return httpx.Client(base_url=url, transport=transport or DeadlineTransport(), mounts=mounts,
                        headers=headers)  # fmt: skip


def renewed(resolver: Resolver, old: Source, new: Source) -> Resolver:
    """A resolver like ``resolver`` with ``new`` in the place of ``old`` (if there), the other
    sources' locks renewed (a snapshot's, held by a parent thread loading it, blocked the
    child's every lookup), and what it knew: the answers it remembered, and the configs it
    checked here, failed ones included (a child must not launch what its parent proved
    wrong, its dispute perhaps still queued). None of its locks or threads."""
    for source in resolver.sources:
        if source is not old:
            source.renew_after_fork()
    fresh = Resolver([new if source is old else source for source in resolver.sources],
                     memo=resolver.memo is not None)  # fmt: skip
    if resolver.memo is not None and fresh.memo is not None:
        fresh.memo.answers.update(resolver.memo.answers)
    fresh.inherit_checks(resolver)
    return fresh


def _before_fork() -> None:
    _LOCK.acquire()


def _after_fork_in_parent() -> None:
    _LOCK.release()


def _after_fork_in_child() -> None:
    global _LOCK
    _LOCK = threading.Lock()
    for renewable in list(_LIVE):
        try:
            renewable.renew_after_fork()
        except Exception as exc:  # a fork must go on: the warning names what kept its pool
            logger.warning("renewing %r after a fork failed: %s", renewable, one_line(exc))


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)  # fmt: skip
