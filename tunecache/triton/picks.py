"""What the drop-in keeps beside Triton's per-key cache to check a pick before its launch.

Triton's ``Autotuner.run`` benchmarks a call's configs, stores the fastest in its per-key cache
and launches it into the caller's tensors, with no step between; :class:`Picks` is that cache,
checking each pick on its way in, and :class:`TuningCall` what the check needs of the call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from triton import Config

from tunecache.key import Key
from tunecache.schemas import CheckModel
from tunecache.triton.fallback import Mark


class Picks(dict[Any, Config]):
    """Triton's per-key cache of chosen configs, each stored as ``pick(key, config)`` says:
    Triton stores its pick and then launches it into the caller's tensors, so the pick is
    checked on its way in (:meth:`tunecache.triton.autotuner.CachedAutotuner._checked_pick`)."""

    def __init__(self, pick: Callable[[Any, Config], Config]) -> None:
        super().__init__()
        self._pick = pick

    def __setitem__(self, key: Any, config: Config) -> None:
        super().__setitem__(key, self._pick(key, config))


@dataclass
class TuningCall:
    """The call a thread is tuning: its key, Triton's tuning key and arguments; whether Triton
    picked from timings (measured now, or on disk), what each config measured now (``times``: its
    ``do_bench`` answer), the pick with what its check found, and what replaced it."""

    key: Key
    tuning_key: tuple[Any, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    timed: bool = False
    times: dict[Config, Any] = field(default_factory=dict)
    picked: tuple[Config, CheckModel | None] | None = None
    # What replaced a wrong pick: the fastest config timed here that passed, its check, and the
    # configs found wrong or left unvalidated on the way (fallback.reasons): the key's record.
    replaced: tuple[Config, CheckModel, tuple[Mark, ...]] | None = None
