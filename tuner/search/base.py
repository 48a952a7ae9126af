"""The search-strategy interface: ask for a config, tell how it did.

A strategy only proposes; measuring is the caller's job (:mod:`tuner.search.loop` drives a
strategy against an evaluator — the measurement harness, or a landscape replayed as a simulated
device). Strategies are registered by name in :mod:`tuner.search`.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Sequence
from typing import ClassVar

from tunecache.space import Config, SearchSpace


class SearchStrategy(abc.ABC):
    """Proposes configs from ``space``; ``warm_start`` configs are proposed first, in order.

    Args:
        space: the (pruned) space to search.
        seed: makes every proposal sequence reproducible.
        warm_start: configs to try first (the winners of neighbouring keys); those outside the
            space are skipped.
    """

    name: ClassVar[str]
    uses_prior: ClassVar[bool] = False  # takes ``prior=`` (other devices' scores per config)

    def __init__(
        self, space: SearchSpace, *, seed: int = 0, warm_start: Sequence[Config] = ()
    ) -> None:
        self.space = space
        self.seed = seed
        self.warm_start = [
            space.complete(c) for c in dict.fromkeys(warm_start) if space.contains(c)
        ]
        self._warm_left = list(self.warm_start)

    def next_warm(self, taken: Callable[[Config], bool]) -> Config | None:
        """The next warm-start config not ``taken`` (each is offered once, in order), or
        ``None`` when none is left."""
        while self._warm_left:
            config = self._warm_left.pop(0)
            if not taken(config):
                return config
        return None

    @abc.abstractmethod
    def ask(self) -> Config | None:
        """The next config to measure, or ``None`` when the strategy has nothing left to try."""

    @abc.abstractmethod
    def tell(self, config: Config, time_ms: float | None) -> None:
        """Reports a measured config: its time, or ``None`` if it failed (never a winner)."""


def usable(time_ms: float | None) -> float | None:
    """A told time a strategy can learn from (positive and finite), else ``None``: a failure.

    Example:
        >>> usable(1.5), usable(float("nan")), usable(0.0), usable(None)
        (1.5, None, None, None)
    """
    return time_ms if time_ms is not None and time_ms > 0 and math.isfinite(time_ms) else None
