"""One server read per agreement across the ranks of a ``torch.distributed`` job.

The ranks of one job must launch the same schedules and choices, yet each rank reading the
server on its own may get a different answer: a record uploaded between two ranks' reads, a
server shedding one rank's read (503), a hostile server answering ranks differently.
:func:`shared_read` makes one rank read for all: the ranks agree through the default process
group's key-value store, as :mod:`tunecache.triton.ranks` does, never through a collective (a
collective pairs calls by order, so ranks reading in different orders would swap answers, and
it would pair with the user's own collectives).

The first rank to reach a read's name claims it (``store.add(name + "/claims", 1) == 1``,
atomic), reads, and publishes what it read; every other rank that reaches the name waits for
that and parses it back, never asking the server. A read the caller repeats (the server did not
answer, so it is asked again later) takes a new name (:func:`next_name` counts them), so the
ranks agree on each attempt, "no answer" included.

What a peer publishes is as untrusted as what a server answers: :func:`load_artifacts` runs it
through the same models and bounds the client runs a server's answer through, and the callers
check every item again as they check a served one.

The wait is bounded by the store's timeout (``init_process_group(timeout=...)``; else
:data:`WAIT`). Past it, where the reading rank failed or published what is refused, or with no
store (or one that fails), a rank reads the server alone, one warning per cause per process
saying the ranks may end with different answers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from pydantic import TypeAdapter

from tunecache.artifacts import READ_CONTAINERS, ArtifactPublic, Namespace
from tunecache.errors import one_line
from tunecache.jsonsafe import past_bound
from tunecache.processlock import ProcessLock
from tunecache.strict import SERVED

logger = logging.getLogger(__name__)
T = TypeVar("T")

WAIT = timedelta(minutes=30)  # where the store does not say its own timeout
READ = "read:"  # a published read starts so; what follows is the caller's ``dump``
FAILED = "failed"  # what a reading rank whose read raised publishes: nothing to take
_warned: set[str] = set()  # the causes this process has warned of (one warning each)
_attempts: dict[str, int] = {}  # reads named so far in this process, by what they read
_lock = ProcessLock()  # a forked child gets it free
_ITEMS: TypeAdapter[list[ArtifactPublic]] = TypeAdapter(list[ArtifactPublic])


def shared_read(named: Callable[[], str], read: Callable[[], T], dump: Callable[[T], str],
                load: Callable[[str], T]) -> T:  # fmt: skip
    """``read()``, once for all the ranks of a distributed job that reach the name ``named()``
    gives (asked only in such a job: a lookup outside one pays for no name).

    Outside a job of two ranks or more (or with no usable store), ``read()`` itself. Otherwise
    the rank that claims the name first returns ``read()`` and publishes ``dump()`` of it; the
    others return ``load()`` of what it published. ``load`` raising refuses the published
    value: that rank then reads alone (warned), as it does past the wait.
    """
    store = _default_store()
    if store is None:
        return read()
    name = named()
    try:
        decides = int(store.add(f"{name}/claims", 1)) == 1
    except Exception as exc:
        _alone("store", f"the process group's store failed ({one_line(exc)})")
        return read()
    if decides:
        return _decide(store, name, read, dump)
    return _follow(store, name, read, load)


def _decide(store: Any, name: str, read: Callable[[], T], dump: Callable[[T], str]) -> T:
    """Reads for every rank, and publishes even when the read raises: a waiting rank must not
    wait out its whole timeout for a value that will never come."""
    try:
        result = read()
    except BaseException:
        _publish(store, name, FAILED)
        raise
    try:
        value = READ + dump(result)
    except Exception as exc:  # the others read alone, warned; this rank keeps what it read
        logger.warning("tunecache: could not publish %s to the other ranks (%s)", name,
                       one_line(exc))  # fmt: skip
        value = FAILED
    _publish(store, name, value)
    return result


def _publish(store: Any, name: str, value: str) -> None:
    try:
        store.set(name, value)
    except Exception as exc:  # the waiting ranks read alone past their wait
        logger.warning("tunecache: could not publish %s to the other ranks (%s)", name,
                       one_line(exc))  # fmt: skip


def _follow(store: Any, name: str, read: Callable[[], T], load: Callable[[str], T]) -> T:
    """What the claiming rank published, parsed by ``load``; else ``read()`` alone, warned."""
    timeout = getattr(store, "timeout", None)
    wait = timeout if isinstance(timeout, timedelta) else WAIT
    try:
        store.wait([name], wait)
        value = store.get(name).decode()
    except Exception as exc:  # past the wait, or the store failed
        _alone("wait", f"{name}: another rank claimed this read and published nothing within "
                       f"{wait.total_seconds():.0f} s ({one_line(exc)})")  # fmt: skip
        return read()
    if not value.startswith(READ):
        _alone("failed", f"{name}: the rank reading for the others failed")
        return read()
    try:
        return load(value[len(READ) :])
    except Exception as exc:  # a peer is as untrusted as the server
        _alone("refused", f"{name}: what another rank published is refused ({one_line(exc)})")
        return read()


def _default_store() -> Any | None:
    """The default process group's store, in a job of two ranks or more."""
    found = job_store(lambda why: _alone("store", why))
    return None if found is None else found[0]


def job_store(alone: Callable[[str], None]) -> tuple[Any, int] | None:
    """The default process group's store and this rank, in a job of two ranks or more;
    ``alone(why)`` where the group has no store that works. It looks only when
    ``torch.distributed`` is imported already: a job's process group needs it, and a TVM user's
    first read should not pay for importing torch."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return None
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store(), int(dist.get_rank())
    except Exception as exc:  # a torch without it, or a group without one
        alone(f"no store for the default process group ({one_line(exc)})")
        return None


def _alone(cause: str, why: str) -> None:
    log = logger.debug if cause in _warned else logger.warning
    _warned.add(cause)
    log("tunecache: %s: this rank reads the server alone; the ranks may end with different "
        "answers", why)  # fmt: skip


def next_name(namespace: str, *parts: str | None) -> str:
    """The store name of this process's next read of ``parts`` (a partition, a key) in
    ``namespace``: each read has its own, counted per ``parts``, so ranks making the same reads
    in the same order meet at the same names; hashed, so any text makes a short name."""
    digest = hashlib.sha256(json.dumps([namespace, *parts]).encode()).hexdigest()[:32]
    with _lock:
        attempt = _attempts.get(digest, 0)
        _attempts[digest] = attempt + 1
    return f"tunecache/{namespace}/{digest}/{attempt}"


def dump_artifacts(items: Sequence[ArtifactPublic] | None) -> str:
    """A read's items as JSON (``null``: the server did not answer)."""
    if items is None:
        return "null"
    return json.dumps([item.model_dump(mode="json") for item in items], separators=(",", ":"))


def load_artifacts(text: str, namespace: Namespace, partition: str,
                   key: str | None) -> list[ArtifactPublic] | None:  # fmt: skip
    """Published items checked as :meth:`tunecache.Client.get_artifacts` checks a server's: the
    same bound on containers (all of a read's pages together held no more), the same models,
    and only ``namespace``'s items of ``partition`` (of ``key``). No bound on their number
    but that one: the reading rank keeps every item its client took, so a follower that cut
    them would end with other records than it.

    Raises:
        ValueError: past the bound, or not a list of artifacts.
    """
    body = text.encode()
    if body == b"null":
        return None
    if past := past_bound(body, READ_CONTAINERS):
        raise ValueError(past)
    items = _ITEMS.validate_json(body, context=SERVED)
    return [item for item in items if item.namespace == namespace
            and item.partition == partition and key in (None, item.key)]  # fmt: skip


def shared_artifacts(read: Callable[[], list[ArtifactPublic] | None], namespace: Namespace,
                     partition: str, key: str | None) -> list[ArtifactPublic] | None:  # fmt: skip
    """``read()`` of ``namespace``'s items of ``partition`` (of ``key``), once for the ranks:
    the next attempt's :func:`shared_read`, published as JSON and parsed back checked."""

    def load(text: str) -> list[ArtifactPublic] | None:
        return load_artifacts(text, namespace, partition, key)

    return shared_read(lambda: next_name(namespace, partition, key), read, dump_artifacts, load)


__all__ = [
    "dump_artifacts",
    "job_store",
    "load_artifacts",
    "next_name",
    "shared_artifacts",
    "shared_read",
]
