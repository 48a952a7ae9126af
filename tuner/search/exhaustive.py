"""Exhaustive search: the warm-start configs, then every config of the space in order, once each.

The right strategy when the budget covers the (pruned) space; otherwise it only samples the start
of the space's fixed order, so prefer ``random`` or ``optuna``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tunecache.space import Config, SearchSpace
from tuner.search.base import SearchStrategy


class ExhaustiveSearch(SearchStrategy):
    """Proposes the warm-start configs, then ``space.configs()`` in order, skipping repeats.

    Example:
        >>> space = SearchSpace({"BLOCK": (16, 32, 64)})
        >>> search = ExhaustiveSearch(space, warm_start=[Config.of({"BLOCK": 64})])
        >>> [str(search.ask()) for _ in range(4)]
        ['BLOCK=64', 'BLOCK=16', 'BLOCK=32', 'None']
    """

    name = "exhaustive"

    def __init__(
        self, space: SearchSpace, *, seed: int = 0, warm_start: Sequence[Config] = ()
    ) -> None:
        super().__init__(space, seed=seed, warm_start=warm_start)
        self._order = self._proposals()

    def _proposals(self) -> Iterator[Config]:
        yield from self.warm_start
        warm = set(self.warm_start)
        yield from (config for config in self.space.configs() if config not in warm)

    def ask(self) -> Config | None:
        return next(self._order, None)

    def tell(self, config: Config, time_ms: float | None) -> None:
        """Nothing to learn: the order is fixed."""
