"""A portfolio: several searches over one space, the budget moved to whichever finds good configs.

No one strategy leads on every family of kernels: on brute-forced GPU landscapes the Gaussian
process (``bayes``) led on some families and fell below random on a device of another, where
TPE (``optuna``) held. So the portfolio runs them side by side:

* **arms**: ``bayes`` (a GP with expected improvement, and the prior from other devices where
  there is one), ``optuna`` (TPE over categorical parameters), ``local`` (the best configs'
  neighbours, ranked by an additive model) and ``random``. Every arm is told every result,
  whoever proposed it, so each models all that was measured;
* **the start**: the warm start, then the ``bayes`` arm's initial sample (random, or the
  prior's best configs);
* **the allocation**: each ask draws the arm by Thompson sampling. A proposal's result is
  graded by where it lands among all results so far: better than all of them, a whole success;
  worse than all (or failed), a whole miss; in between, that share of each. Each arm's successes
  and misses are a Beta posterior, so an arm that keeps finding good configs gets most of the
  budget, and one a space misleads loses it within a few proposals, while every arm keeps a
  chance to be tried again.

Replayed on the shared GPU landscapes and on the same landscapes with every parameter's choices
relabelled at random (``--scrambled``: a family where order says nothing, as a space never seen
may have), 10 seeds (bench/results/search_efficiency-gpu-landscapes.md): the worst family's
mean at 100 evaluations 0.936 of the optimum (``bayes`` 0.914, ``optuna`` 0.891), at 200 0.985
(0.940, 0.903); the families' average equal to ``bayes`` at 25 and 50 (0.899, 0.951) and above
it after. Where TPE is the best arm (the scrambled dedispersion family) it trails TPE by 2-3 %
at 25-50 evaluations: the price of trying the others.

An arm that proposes a config already proposed (by another arm, or still being measured) is
asked again, a few times, then another arm is drawn; ``ask`` returns ``None`` exactly when every
config of the space was proposed. Deterministic under a seed.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Mapping, Sequence

from tunecache.space import Config, SearchSpace
from tuner.search.base import SearchStrategy
from tuner.search.bayes import BayesSearch
from tuner.search.local import LocalSearch
from tuner.search.optuna_tpe import OptunaSearch
from tuner.search.random_search import RandomSearch

RETRIES = 4  # asks of one arm for a config not yet proposed, before another arm is drawn
ARMS = ("bayes", "optuna", "local", "random")


class PortfolioSearch(SearchStrategy):
    """Thompson sampling over ``bayes``, ``optuna``, ``local`` and ``random`` (see the module).

    Args:
        prior: a score per config from other devices or shapes (lower is better), for the
            ``bayes`` arm; optional.

    Example:
        >>> space = SearchSpace({"BLOCK": (16, 32, 64, 128), "warps": (2, 4, 8)})
        >>> search = PortfolioSearch(space, seed=0)
        >>> sorted(search.arms)
        ['bayes', 'local', 'optuna', 'random']
        >>> for _ in range(8):
        ...     config = search.ask()
        ...     search.tell(config, abs(config["BLOCK"] - 64) + config["warps"] + 1.0)
        >>> round(sum(search.wins.values()) + sum(search.misses.values()), 6)  # graded asks
        4.0
    """

    name = "portfolio"
    uses_prior = True

    def __init__(
        self,
        space: SearchSpace,
        *,
        seed: int = 0,
        warm_start: Sequence[Config] = (),
        prior: Mapping[Config, float] | None = None,
    ) -> None:
        super().__init__(space, seed=seed, warm_start=warm_start)
        self._bayes = BayesSearch(space, seed=seed, prior=prior)
        arms: dict[str, SearchStrategy] = {
            "bayes": self._bayes,
            "optuna": OptunaSearch(space, seed=seed),
            "local": LocalSearch(space, seed=seed),
            "random": RandomSearch(space, seed=seed + 1),  # not bayes's initial sample again
        }
        self.arms = {name: arm for name, arm in arms.items() if name in ARMS}
        self.wins = dict.fromkeys(self.arms, 0.0)
        self.misses = dict.fromkeys(self.arms, 0.0)
        self._rng = random.Random(seed)
        self._proposed: set[Config] = set()
        self._by: dict[Config, str] = {}  # a proposal's arm, until it is told
        self._sorted: list[float] = []  # successful times so far, ascending
        self._spent: set[str] = set()  # arms with nothing left to propose
        self._exhausted = False  # whether the last _fresh found its strategy out of configs
        self._total = len(space.valid())

    def ask(self) -> Config | None:
        if len(self._proposed) >= self._total:
            return None
        warm = self.next_warm(self._proposed.__contains__)
        if warm is not None:
            return self._propose(warm, "warm")
        if len(self._proposed) < self._bayes.initial:
            config = self._fresh(self._bayes)  # its initial sample: random, or the prior's best
            if config is not None:
                return self._propose(config, "start")
        while len(self._spent) < len(self.arms):
            arm = self._draw()
            config = self._fresh(self.arms[arm])
            if config is not None:
                return self._propose(config, arm)
            if self._exhausted:
                self._spent.add(arm)
        return None

    def tell(self, config: Config, time_ms: float | None) -> None:
        arm = self._by.pop(config, None)
        if self.space.contains(config):  # not a default config from outside it
            self._proposed.add(config)
        ok = time_ms is not None and time_ms > 0 and math.isfinite(time_ms)
        if arm in self.arms:  # the warm start and the initial sample are nobody's
            share = 1.0  # a failure: a whole miss, whatever succeeded before
            if ok and time_ms is not None:  # 0: better than every result so far, 1: worst
                share = bisect.bisect_left(self._sorted, time_ms) / max(1, len(self._sorted))
            self.wins[arm] += 1.0 - share
            self.misses[arm] += share
        if ok and time_ms is not None:
            bisect.insort(self._sorted, time_ms)
        for strategy in self.arms.values():
            strategy.tell(config, time_ms)

    # -- internals ---------------------------------------------------------------------------
    def _propose(self, config: Config, arm: str) -> Config:
        self._proposed.add(config)
        self._by[config] = arm
        return config

    def _draw(self) -> str:
        """The arm with the largest draw from its Beta(1 + wins, 1 + misses), of those left."""
        draws = {arm: self._rng.betavariate(1 + self.wins[arm], 1 + self.misses[arm])
                 for arm in self.arms if arm not in self._spent}  # fmt: skip
        return max(draws, key=draws.__getitem__)

    def _fresh(self, strategy: SearchStrategy) -> Config | None:
        """A config ``strategy`` proposes that nobody has, or ``None``: after :data:`RETRIES`
        proposals already made (``_exhausted`` false), or when it has none left (true)."""
        self._exhausted = False
        for _ in range(RETRIES):
            config = strategy.ask()
            if config is None:
                self._exhausted = True
                return None
            if config not in self._proposed:
                return config
        return None
