"""One config per (kernel, tuning key) across the ranks of a ``torch.distributed`` job.

The ranks agree through the default process group's key-value store, never a collective: a
collective pairs calls by order, so ranks meeting keys in different orders, running different
kernels, or meeting a key alone would swap configs, take another kernel's, or pair with the
user's own collectives. Each (kernel, tuning key) has its own store entries, named by the
kernel's identity (``module:qualname`` and source hash) and a digest of Triton's tuning key.

The first rank to reach a key claims it (``store.add(claim, 1) == 1``, atomic) and decides it as
a process alone does (lookup, tuning on a miss, validation), then writes the chosen config as
canonical JSON (:meth:`Agreement.publish`; a decider whose call raised writes that it failed).
Every other rank that reaches the key waits for that value (:meth:`Agreement.follow`), never
looking up, verifying, reporting or tuning, and launches it placed through its own kernel's list
or space as a served config is; one its kernel would not take is never launched: the first config
the kernel keeps runs instead (one warning). A rank that reaches a key alone decides it alone.

The wait is bounded by the store's timeout (``init_process_group(timeout=...)``; else
:data:`WAIT`): the decider may be tuning. Past it, or where the decider failed, the rank decides
the key alone, one warning saying the ranks may launch different configs there. No store (or one
that fails): the ranks decide alone, one warning per process.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from triton import Config

from tunecache.errors import one_line
from tunecache.problem import describe
from tunecache.ranks import job_store
from tunecache.triton.keys import KernelIdentity
from tunecache.triton.record import config_json

logger = logging.getLogger(__name__)
WAIT = timedelta(minutes=30)  # where the store does not say its own timeout
FAILED = "failed"  # what a decider whose call raised writes: nothing to launch
Warn = Callable[[str, str], None]  # (what, message): warned once per kernel and ``what``
_unagreed: list[str] = []  # why this process's ranks decide alone, warned once


@dataclass(frozen=True)
class Agreement:
    """One (kernel, tuning key)'s entries in the store, as this rank sees them."""

    store: Any
    name: str  # the value's entry; the claims count under ``name + "/claims"``
    rank: int
    wait: timedelta
    decides: bool  # this rank claimed the key first: it decides, the others follow

    def publish(self, config: Config | None) -> None:
        """Writes the decision (``None``: the decider's call raised) for the ranks waiting."""
        value = FAILED if config is None else canonical({"config": config_json(config),
                                                          "rank": self.rank})  # fmt: skip
        try:
            self.store.set(self.name, value)
        except Exception as exc:  # the waiting ranks decide alone past their wait
            logger.warning("tunecache.triton: could not publish %s's config to the other ranks "
                           "(%s)", self.name, one_line(exc))  # fmt: skip

    def follow(self, admit: Callable[[dict[str, Any]], Config | str],
               fits: Callable[[dict[str, Any]], str | None], first: Callable[[], Config],
               warn: Warn) -> Config | None:  # fmt: skip
        """The config the decider chose, admitted as a served config is (``fits``, then
        ``admit``: this kernel's own listed object, or one built from its declared space; else
        ``first()``, warned); ``None`` (warned): this rank decides the key alone."""
        try:
            self.store.wait([self.name], self.wait)
            value = self.store.get(self.name).decode()
            decision = None if value == FAILED else json.loads(value)
            chosen, decider = (None, None) if decision is None else (
                dict(decision["config"]), int(decision["rank"]))  # fmt: skip
        except Exception as exc:  # past the wait, the store failed, or not our value
            warn("rank-wait", f"{self.name}: another rank claimed this key and no config came "
                              f"within {self.wait.total_seconds():.0f} s ({one_line(exc)}); "
                              "this rank decides it alone: the ranks may launch different "
                              "configs at it")  # fmt: skip
            return None
        if chosen is None:
            warn("rank-failed", f"{self.name}: the rank deciding this key failed in its call; "
                                "this rank decides it alone")  # fmt: skip
            return None
        why = fits(chosen)
        placed = admit(chosen) if why is None else why
        if isinstance(placed, str):
            fallback = first()
            warn("rank-outside", f"{self.name}: the config rank {decider} decided, "
                                 f"{describe(chosen, 200)}, is {placed}: never launched here; "
                                 f"launching {fallback}, the first the kernel keeps")  # fmt: skip
            return fallback
        logger.info("%s: launching %s, as rank %d decided", self.name, placed, decider)
        return placed


def agree(identity: KernelIdentity, tuning_key: tuple[Any, ...]) -> Agreement | None:
    """This rank's part in deciding ``tuning_key`` of the kernel (claimed here when no rank has
    claimed it yet); ``None`` outside a distributed job of two ranks or more, or where the ranks
    cannot agree (no store, a store that fails: warned once per process)."""
    found = _default_store()
    if found is None:
        return None
    store, rank = found
    digest = hashlib.sha256(repr(tuning_key).encode()).hexdigest()[:32]
    name = f"tunecache/triton/{identity.name}@{identity.source_hash}/{digest}"
    try:
        decides = int(store.add(f"{name}/claims", 1)) == 1
    except Exception as exc:
        _alone(f"the process group's store failed ({one_line(exc)})")
        return None
    wait = getattr(store, "timeout", None)
    return Agreement(store, name, rank, wait if isinstance(wait, timedelta) else WAIT, decides)


def _default_store() -> tuple[Any, int] | None:
    """The default process group's store and this rank, in a job of two ranks or more."""
    return job_store(_alone)


def _alone(why: str) -> None:
    log = logger.debug if _unagreed else logger.warning
    _unagreed[:] = [why]
    log("tunecache.triton: %s: each rank decides its tuning keys alone; the ranks may launch "
        "different configs", why)  # fmt: skip


def canonical(value: Any) -> str:
    """``value`` as canonical JSON: the same text on every rank."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


__all__ = ["Agreement", "agree"]
