"""Search strategies by name, and the loop that drives one against an evaluator.

Example:
    >>> from tunecache.space import SearchSpace
    >>> space = SearchSpace({"BLOCK": (16, 32, 64)})
    >>> get_strategy("random", space, seed=3).name
    'random'
    >>> sorted(STRATEGIES)
    ['bayes', 'exhaustive', 'local', 'optuna', 'portfolio', 'random']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tunecache.errors import lookup
from tunecache.space import Config, SearchSpace
from tuner.search.base import SearchStrategy
from tuner.search.bayes import BayesSearch
from tuner.search.exhaustive import ExhaustiveSearch
from tuner.search.local import LocalSearch
from tuner.search.loop import Evaluator, SearchLog, run_search
from tuner.search.optuna_tpe import OptunaSearch
from tuner.search.portfolio import PortfolioSearch
from tuner.search.random_search import RandomSearch

STRATEGIES: dict[str, type[SearchStrategy]] = {
    cls.name: cls
    for cls in (ExhaustiveSearch, RandomSearch, OptunaSearch, BayesSearch, LocalSearch,
                PortfolioSearch)
}  # fmt: skip
DEFAULT_STRATEGY = "portfolio"  # bench/results/search_efficiency.md, search_lofo.md: by family


def get_strategy(
    name: str,
    space: SearchSpace,
    *,
    seed: int = 0,
    warm_start: Sequence[Config] = (),
    prior: Mapping[Config, float] | None = None,
) -> SearchStrategy:
    """A fresh strategy called ``name`` over ``space``.

    Args:
        name: a key of :data:`STRATEGIES`.
        space: the (pruned) space to search.
        seed: makes the proposal sequence reproducible.
        warm_start: configs to propose first (those outside the space are skipped).
        prior: scores of configs on other devices or shapes (lower is better), for the
            strategies that model the space (``bayes``, ``portfolio``); the others ignore it.

    Raises:
        InvalidInput: no strategy has that name.
    """
    cls = lookup(STRATEGIES, name, "search strategy")
    if prior and cls.uses_prior:
        return cls(space, seed=seed, warm_start=warm_start, prior=prior)  # type: ignore[call-arg]
    return cls(space, seed=seed, warm_start=warm_start)


__all__ = [
    "DEFAULT_STRATEGY",
    "STRATEGIES",
    "Evaluator",
    "SearchLog",
    "SearchStrategy",
    "get_strategy",
    "run_search",
]
