"""A portfolio: several searches over one space, the budget moved to whichever improves the best.

No one strategy leads on every family of kernels: on brute-forced GPU landscapes the Gaussian
process (``bayes``) led on some families and fell below random on a device of another, where
TPE (``optuna``) held. So the portfolio runs them side by side:

* **arms**: ``bayes`` (a GP with expected improvement, and the prior from other devices where
  there is one), ``optuna`` (TPE over categorical parameters), ``local`` (the best configs'
  neighbours, ranked by an additive model) and ``random``. Every arm is told every result,
  whoever proposed it, so each models all that was measured;
* **the start**: the warm start, then the ``bayes`` arm's initial sample (spread over the
  space, away from the configs it proposed and those told to it, such as the warm start's once
  measured; or the prior's best configs);
* **the allocation**: each ask draws the arm by Thompson sampling. A proposal is graded by
  progress: a whole success when it is faster than every result known when it was proposed, a
  whole miss otherwise (or when it failed). Each arm's successes and misses are a Beta
  posterior, so the arm that keeps moving the best gets most of the budget, one a space
  misleads loses it within a few proposals, and every arm keeps a chance to be tried again.
  Graded instead by rank among the results (a share of a success for a config better than
  most), the ``local`` arm took 38-62 of the 75 proposals after the 25th (3 of 4 seeds, the
  relabelled A100 dedispersion landscape) with neighbours of the best that seldom beat it;
* **polish late**: the ``local`` arm is drawn only after ``local_after`` proposals (25). Before
  then the best config is one of a few random ones, and polishing its neighbours spends the
  budget on a basin chosen by chance: on the relabelled dedispersion family, 0.917 / 0.954 of
  the optimum at 25 / 50 evaluations against 0.935 / 0.961 (10 seeds); after, it is what
  finishes a search the models brought near.

Replayed on the shared GPU landscapes, this project's CPU landscapes, and all of them with every
parameter's choices relabelled at random (``--scrambled``: a family where order says nothing, as
a space never seen may have), 10 seeds: bench/results/search_efficiency.md; against ``optuna``
and ``random`` at 30 seeds, cold and with the prior: search_efficiency_30_seeds.md,
search_efficiency_transfer.md.

An arm that proposes a config already proposed (by another arm, or still being measured) is
asked again, a few times, then another arm is drawn; ``ask`` returns ``None`` exactly when every
config of the space was proposed. Deterministic under a seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from tunecache.errors import InvalidInput
from tunecache.space import Config, SearchSpace
from tuner.search.base import SearchStrategy, usable
from tuner.search.bayes import BayesSearch
from tuner.search.local import LocalSearch
from tuner.search.optuna_tpe import OptunaSearch
from tuner.search.random_search import RandomSearch

RETRIES = 4  # asks of one arm for a config not yet proposed, before another arm is drawn
LOCAL_AFTER = 25  # proposals before the local arm is drawn (see the module)
ARMS = ("bayes", "optuna", "local", "random")


class PortfolioSearch(SearchStrategy):
    """Thompson sampling over ``bayes``, ``optuna``, ``local`` and ``random`` (see the module).

    Args:
        prior: a score per config from other devices or shapes (lower is better), for the
            ``bayes`` arm; optional.
        initial: proposals of the ``bayes`` arm's initial sample (default: its own).
        local_after: proposals before the ``local`` arm is drawn (unless it is the only one
            left).
        arms: which of :data:`ARMS` to run (the initial sample is ``bayes``'s all the same).

    Raises:
        InvalidInput: ``arms`` is empty or names an arm not in :data:`ARMS`.

    Example:
        >>> space = SearchSpace({"BLOCK": (16, 32, 64, 128), "warps": (2, 4, 8)})
        >>> search = PortfolioSearch(space, seed=0)
        >>> sorted(search.arms)
        ['bayes', 'local', 'optuna', 'random']
        >>> for _ in range(8):
        ...     config = search.ask()
        ...     search.tell(config, abs(config["BLOCK"] - 64) + config["warps"] + 1.0)
        >>> search.initial  # the first three are the initial sample: nobody's
        3
        >>> sum(search.wins.values()) + sum(search.misses.values())  # the five graded asks
        5.0
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
        initial: int | None = None,
        local_after: int = LOCAL_AFTER,
        arms: Sequence[str] = ARMS,
    ) -> None:
        super().__init__(space, seed=seed, warm_start=warm_start)
        if not arms or not set(arms) <= set(ARMS):
            raise InvalidInput(f"portfolio arms: some of {', '.join(ARMS)}, got {list(arms)}")
        self._bayes = BayesSearch(space, seed=seed, prior=prior, initial=initial)
        self.local_after = local_after
        every: dict[str, SearchStrategy] = {
            "bayes": self._bayes,
            "optuna": OptunaSearch(space, seed=seed),
            "local": LocalSearch(space, seed=seed),
            "random": RandomSearch(space, seed=seed + 1),  # not bayes's initial sample again
        }
        self.arms = {name: arm for name, arm in every.items() if name in arms}
        self.wins = dict.fromkeys(self.arms, 0.0)
        self.misses = dict.fromkeys(self.arms, 0.0)
        self._rng = random.Random(seed)
        self._proposed: set[Config] = set()
        # A proposal's arm and the best time when it was proposed, until it is told: in a
        # batch, each result is graded against what its arm knew, not against its batch-mates.
        self._by: dict[Config, tuple[str, float]] = {}
        self._best = math.inf  # the fastest time so far
        self._spent: set[str] = set()  # arms with nothing left to propose
        self._exhausted = False  # whether the last _fresh found its strategy out of configs
        self._total = len(space.valid())

    @property
    def initial(self) -> int:
        """Proposals of the ``bayes`` arm's initial sample, before any arm is drawn."""
        return self._bayes.initial

    def ask(self) -> Config | None:
        if len(self._proposed) >= self._total:
            return None
        warm = self.next_warm(self._proposed.__contains__)
        if warm is not None:
            return self._propose(warm, "warm")
        if len(self._proposed) < self.initial:
            config = self._fresh(self._bayes)  # its initial sample: spread, or the prior's best
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
        arm, best_then = self._by.pop(config, ("", math.inf))
        if self.space.contains(config):  # not a default config from outside it
            self._proposed.add(config)
        time_ms = usable(time_ms)  # every arm is told a failure for a time nothing can use
        if arm in self.arms:  # the warm start and the initial sample are nobody's
            faster = time_ms is not None and time_ms < best_then
            self.wins[arm] += faster
            self.misses[arm] += not faster
        if time_ms is not None:
            self._best = min(self._best, time_ms)
        told = [*self.arms.values()]
        if self._bayes not in told:  # it draws the initial sample: it must know what was taken
            told.append(self._bayes)
        for strategy in told:
            strategy.tell(config, time_ms)

    # -- internals ---------------------------------------------------------------------------
    def _propose(self, config: Config, arm: str) -> Config:
        self._proposed.add(config)
        self._by[config] = (arm, self._best)
        return config

    def _draw(self) -> str:
        """The arm with the largest draw from its Beta(1 + wins, 1 + misses), of those left
        (``local`` only after ``local_after`` proposals, unless no other arm is left)."""
        late = len(self._proposed) >= self.local_after
        left = [arm for arm in self.arms if arm not in self._spent and (late or arm != "local")]
        draws = {arm: self._rng.betavariate(1 + self.wins[arm], 1 + self.misses[arm])
                 for arm in left or [a for a in self.arms if a not in self._spent]}  # fmt: skip
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
