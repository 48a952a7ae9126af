"""torch.compile max-autotune, team-shared: Inductor's autotune choices from the tunecache server.

One call before ``torch.compile`` makes this process start from what the team has measured:

* GEMM choice timings (namespace ``inductor.choices``, :mod:`tunecache.inductor.choices`) are
  fetched and merged into Inductor's local choice file, so max-autotune finds every candidate's
  time and picks the fastest without benchmarking;
* Triton kernels' best configs (namespace ``inductor.autotune``, CUDA only,
  :mod:`tunecache.inductor.autotune`) are read from and recorded for the team cache through
  Inductor's ``RemoteAutotuneCache``, for the kernels Inductor compiles in this process (all of
  them with ``torch._inductor.config.compile_threads = 1``; not those of its worker processes).

In a ``torch.distributed`` job one rank reads the choice groups for every rank
(:func:`tunecache.ranks.shared_artifacts`), so the ranks merge the same groups.

Entries are shared within a partition (:func:`partition`: Inductor's system hash and the torch
version). Only JSON crosses the wire; Inductor's FX-graph cache (pickles) is never served. A
server that is down, slow, refuses the token or answers garbage costs one warning
(:class:`TeamCacheWarning`) and at most the lookup timeout per request: Inductor then autotunes
on its own. Importing this package imports torch; ``import tunecache`` does not.

Example:
    >>> import torch, tunecache.inductor
    >>> tunecache.inductor.enable("http://127.0.0.1:8765", upload=True)  # doctest: +SKIP
    >>> compiled = torch.compile(model, mode="max-autotune")  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import logging
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from tunecache.artifacts import (
    UNSERVED_NOTE,
    ArtifactIn,
    ArtifactPublic,
    ArtifactPutResult,
    Namespace,
)
from tunecache.errors import ServerError
from tunecache.inductor import autotune, choices
from tunecache.inductor.autotune import AutotuneStore
from tunecache.inductor.choices import ChoiceGroup, local_cache_path
from tunecache.inductor.partition import inductor_system, partition
from tunecache.inductor.remote import DEFAULT_TIMEOUT, MAX_ITEMS, TeamCache, TeamCacheWarning
from tunecache.ranks import shared_artifacts
from tunecache.settings import MAX_LOOKUP_TIMEOUT

logger = logging.getLogger(__name__)

__all__ = ["Enabled", "TeamCacheWarning", "enable", "partition", "share_items", "upload"]


@dataclass(frozen=True)
class Enabled:
    """What :func:`enable` did.

    Attributes:
        partition: the partition read ("" when the team cache could not be set up).
        reachable: whether the server answered.
        fetched: well-formed choice groups read from the server.
        ignored: malformed ones dropped.
        merged: groups added to Inductor's local choice file (the others were there already,
            or past the merge's bounds: :func:`choices.refresh_groups`).
        removed: groups merged by an earlier ``enable()`` that the server no longer serves as
            merged (revoked, disputed, served with other times), taken out of that file.
    """

    partition: str
    reachable: bool
    fetched: int = 0
    ignored: int = 0
    merged: int = 0
    removed: int = 0


_active: tuple[TeamCache, AutotuneStore] | None = None


def enable(
    url: str | None = None,
    token: str | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    upload: bool = False,
) -> Enabled:
    """Pre-fills Inductor's autotune caches from the team cache and keeps it in the loop.

    Call it once, before ``torch.compile``. It never raises on a server failure: it warns once
    and Inductor autotunes as usual.

    Args:
        url: the server; ``TUNECACHE_URL`` when ``None``.
        token: an API token with the ``read`` scope (``write`` too with ``upload``);
            ``TUNECACHE_TOKEN`` when ``None``.
        timeout: seconds each request to the server may take, and checking and merging what it
            answered (at most :data:`choices.MAX_MERGE_GROUPS` groups, the file bounded: see
            :mod:`tunecache.inductor.choices`).
        upload: at exit, upload what this process's compiles chose (see :func:`upload`).

    Returns:
        What was fetched and merged.
    """
    global _active
    try:
        team = TeamCache(url, token, partition(), timeout=timeout)
    except Exception as exc:  # a bad TUNECACHE_* value, or an Inductor that cannot say its system
        warnings.warn(f"tunecache: team cache off: {exc}", TeamCacheWarning, stacklevel=2)
        return Enabled(partition="", reachable=False)
    found = _fetch_groups(team)
    deadline = time.monotonic() + timeout  # reading and merging them, like each request
    groups = _read_groups(found or [], deadline)
    good = [group for group in groups if group is not None]
    # Served groups merged before are taken out only when the server answered in full.
    complete = found is not None and len(found) < MAX_ITEMS and len(groups) == len(found)
    try:
        merged = choices.refresh_groups(local_cache_path(), good, inductor_system(),
                                        deadline=deadline, complete=complete)  # fmt: skip
    except OSError as exc:
        logger.warning("could not write Inductor's choice file: %s", exc)
        merged = choices.Merged()
    store = AutotuneStore(team)
    autotune.install(store)
    _active = (team, store)
    if upload:
        atexit.register(_upload_at_exit, team, store)
    logger.info("team cache %s: %d choice groups, %d merged, %d taken out", team.partition,
                len(good), merged.added, merged.removed)  # fmt: skip
    return Enabled(team.partition, not team.down, len(good), len(groups) - len(good),
                   merged.added, merged.removed)  # fmt: skip


def _read_groups(found: list[ArtifactPublic], deadline: float) -> list[ChoiceGroup | None]:
    """The groups of ``found`` (``None`` for one ill-formed) read before ``deadline``: a page of
    1,000 groups of 1,000 choices each, read from the server within the timeout, took 1.9 s more
    to check here, past a timeout of 1.5 s."""
    groups: list[ChoiceGroup | None] = []
    for item in found:
        if time.monotonic() > deadline:
            logger.warning("team cache: %d of %d choice groups read within the timeout",
                           len(groups), len(found))  # fmt: skip
            break
        groups.append(ChoiceGroup.from_value(item.value))
    return groups


def _fetch_groups(team: TeamCache) -> list[ArtifactPublic] | None:
    """The partition's choice groups, read by one rank for every rank of a distributed job
    (:func:`tunecache.ranks.shared_artifacts`; one read per call): ranks reading on their own
    could merge different groups, and max-autotune then picks different kernels per rank.
    ``None`` when the server did not answer: then what it serves is not known."""

    def read() -> list[ArtifactPublic] | None:
        found = team.fetch(choices.NAMESPACE)
        return None if team.down else found

    return shared_artifacts(read, choices.NAMESPACE, team.partition, None)


def share_items(
    team: TeamCache, groups: Iterable[ChoiceGroup], best_configs: Mapping[str, dict[str, Any]]
) -> list[ArtifactIn]:
    """The artifacts for ``groups`` (choice timings) and ``best_configs`` (Triton configs).

    An entry the server would refuse (too large, too long a key) is left out with a log line.
    """
    wanted: list[tuple[Namespace, str, dict[str, Any], float | None]]
    wanted = [(choices.NAMESPACE, g.key(), g.to_value(), g.best_ms) for g in groups]
    wanted += [(autotune.NAMESPACE, key, value, None) for key, value in best_configs.items()]
    items: list[ArtifactIn] = []
    for namespace, key, value, score in wanted:
        try:
            items.append(team.artifact(namespace, key, value, score))
        except ValidationError as exc:
            logger.warning("Inductor entry %s cannot be stored: %s", key, exc)
    return items


def upload(
    url: str | None = None, token: str | None = None, *, timeout: float = 30.0
) -> ArtifactPutResult | None:
    """Uploads the groups of Inductor's local choice file that this machine's Inductor timed
    (not those still as :func:`enable` merged them from the server: :func:`choices.own_groups`)
    and the best configs this process recorded.

    Args:
        url: the server; the one :func:`enable` used, else ``TUNECACHE_URL``.
        token: a token with the ``write`` scope; ``TUNECACHE_TOKEN`` when ``None``.
        timeout: seconds the upload may take.

    Returns:
        How many entries were stored and kept, or ``None`` when the upload failed (it warns).
    """
    if _active is not None and url is None and token is None:
        team, recorded = _active[0], _active[1].recorded
    else:
        try:  # its reads (what the server holds) as lookups, bounded as they are
            team = TeamCache(url, token, partition(), write=timeout,
                             timeout=min(timeout, MAX_LOOKUP_TIMEOUT))  # fmt: skip
        except Exception as exc:
            warnings.warn(f"tunecache: upload failed: {exc}", TeamCacheWarning, stacklevel=2)
            return None
        recorded = _active[1].recorded if _active is not None else {}
    return _upload(team, recorded)


def _upload(team: TeamCache, recorded: Mapping[str, dict[str, Any]]) -> ArtifactPutResult | None:
    items = share_items(team, choices.own_groups(local_cache_path()), recorded)
    if not items:
        return ArtifactPutResult(stored=0, kept=0)
    try:
        result = team.put(items)
    except ServerError as exc:
        warnings.warn(f"tunecache: upload failed: {exc}", TeamCacheWarning, stacklevel=3)
        return None
    if result.served is False:
        warnings.warn(f"tunecache: {team.url}: {UNSERVED_NOTE}", TeamCacheWarning, stacklevel=3)
    return result


def _upload_at_exit(team: TeamCache, store: AutotuneStore) -> None:
    result = _upload(team, store.recorded)
    if result is not None:
        logger.info("uploaded %d Inductor entries (%d kept)", result.stored, result.kept)
