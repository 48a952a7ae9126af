"""Random search: the warm-start configs, then the rest of the space in a seeded random order.

Sampling is without replacement, so a space of ``n`` configs is covered in ``n`` asks. A strong
baseline for small budgets, and the yardstick the other strategies are compared against.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from tunecache.space import Config, SearchSpace
from tuner.search.base import SearchStrategy


class RandomSearch(SearchStrategy):
    """Proposes the warm-start configs, then a ``seed``-shuffled permutation of the rest.

    Example:
        >>> space = SearchSpace({"BLOCK": (16, 32, 64, 128)})
        >>> search = RandomSearch(space, seed=1, warm_start=[Config.of({"BLOCK": 64})])
        >>> proposed = [search.ask() for _ in range(4)]
        >>> str(proposed[0]), len(set(proposed)), search.ask()
        ('BLOCK=64', 4, None)
    """

    name = "random"

    def __init__(
        self, space: SearchSpace, *, seed: int = 0, warm_start: Sequence[Config] = ()
    ) -> None:
        super().__init__(space, seed=seed, warm_start=warm_start)
        warm = set(self.warm_start)
        rest = [config for config in space.valid() if config not in warm]
        random.Random(seed).shuffle(rest)
        # Popped from the end: reversed so the warm start comes out first, in its order.
        self._pending = [*reversed(rest), *reversed(self.warm_start)]

    def ask(self) -> Config | None:
        return self._pending.pop() if self._pending else None

    def tell(self, config: Config, time_ms: float | None) -> None:
        """Nothing to learn: the order is fixed by the seed."""
