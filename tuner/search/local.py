"""Local search: the unproposed neighbours of the best configs so far, ranked by an additive model.

A neighbour changes one parameter: an ordered one (every choice a number: tile sizes, warps,
stages) by one step either way, another (a flag, a name) to any other choice; when the best
configs' near neighbours are all proposed, any other choice of one parameter. Among them, the
one an additive model of the results ranks best is proposed: each parameter value's mean effect
on log time (shrunk towards none while it was seen rarely), summed over the parameters. The
model costs a dictionary pass per result and the neighbours are a few dozen, so a proposal is
cheap whatever the space's size, and a categorical parameter is as easy as an ordered one —
the pattern search Helion's autotuner filters with a classifier of its best configs, here with
the cheapest model that ranks neighbours at all.

When the best config was reached by one step of an ordered parameter, the next step the same
way comes first (a pattern search's pattern move). Failures count as slower than the slowest
success; random configs come first while nothing has
succeeded (or when every neighbour of the best has been proposed).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence

from tunecache.space import Config, Scalar, SearchSpace
from tuner.search.base import SearchStrategy, usable
from tuner.search.encoding import is_ordered

BEST = 3  # the best configs whose neighbours are tried, best first
SHRINK = 1.0  # results' worth of "no effect" each value's mean effect is shrunk with
FAILURE_MARGIN = 1.0  # a failure counts this much slower (log e) than the slowest success


class LocalSearch(SearchStrategy):
    """Proposes the warm start, then neighbours of the best results (see the module).

    Example:
        >>> space = SearchSpace({"BLOCK": (16, 32, 64, 128), "warps": (2, 4, 8)})
        >>> search = LocalSearch(space, seed=0)
        >>> search.tell(Config.of({"BLOCK": 32, "warps": 4}), 1.0)
        >>> str(search.ask())  # one step of one parameter from the best
        'BLOCK=16 warps=4'
    """

    name = "local"

    def __init__(
        self, space: SearchSpace, *, seed: int = 0, warm_start: Sequence[Config] = ()
    ) -> None:
        super().__init__(space, seed=seed, warm_start=warm_start)
        self._rng = random.Random(seed)
        self._choices = {name: tuple(c) for name, c in space.params.items() if len(c) > 1}
        self._ordered = {name: is_ordered(c) for name, c in self._choices.items()}
        self._proposed: set[Config] = set()
        self._times: dict[Config, float | None] = {}  # log time, None for a failure
        self._unseen: list[Config] | None = None  # the space in a seeded order, made lazily
        self._moves: dict[Config, tuple[str, int]] = {}  # a neighbour's step from its start

    def ask(self) -> Config | None:
        config = self.next_warm(self._proposed.__contains__) or self._neighbour() or self._random()
        return None if config is None else self._propose(config)

    def tell(self, config: Config, time_ms: float | None) -> None:
        if not self.space.contains(config):
            return  # measured outside the space (a default config): no neighbours to walk
        self._proposed.add(config)
        time_ms = usable(time_ms)
        self._times[config] = None if time_ms is None else math.log(time_ms)

    # -- proposals ---------------------------------------------------------------------------
    def _propose(self, config: Config) -> Config:
        self._proposed.add(config)
        return config

    def _ranked(self) -> list[tuple[float, Config]]:
        """Every result as (log time, config), failures after the slowest success, best first."""
        good = [t for t in self._times.values() if t is not None]
        if not good:
            return []
        failed = max(good) + FAILURE_MARGIN
        ranked = [((failed if t is None else t), c) for c, t in self._times.items()]
        return sorted(ranked, key=lambda item: (item[0], str(item[1])))

    def _neighbour(self) -> Config | None:
        ranked = self._ranked()
        if not ranked or all(t is None for t in self._times.values()):
            return None
        effect = self._effects(ranked)
        onward = self._onward(ranked[0][1])
        if onward is not None:
            return onward
        for near in (True, False):
            for _, best in ranked[:BEST]:
                options = [c for c in self._neighbours(best, near) if c not in self._proposed]
                if options:
                    choice = min(options, key=lambda c: (self._score(c, effect), str(c)))
                    self._note_move(best, choice)
                    return choice
        return None

    def _onward(self, best: Config) -> Config | None:
        """One more step the way the move that reached ``best`` went (a pattern search's
        pattern move), if that config is in the space and not proposed."""
        move = self._moves.get(best)
        if move is None:
            return None
        name, step = move
        choices = self._choices[name]
        i = choices.index(best[name]) + step
        if not 0 <= i < len(choices):
            return None
        onward = best.replace(**{name: choices[i]})
        if onward in self._proposed or not self.space.contains(onward):
            return None
        self._moves[onward] = move
        return onward

    def _note_move(self, start: Config, to: Config) -> None:
        """Remembers ``to`` as one step of an ordered parameter from ``start``, if it is."""
        for name, choices in self._choices.items():
            if self._ordered[name] and start[name] != to[name]:
                step = choices.index(to[name]) - choices.index(start[name])
                if abs(step) == 1:
                    self._moves[to] = (name, step)
                return

    def _neighbours(self, config: Config, near: bool) -> Iterator[Config]:
        """The configs of the space one parameter away: one step for an ordered parameter when
        ``near``, else any other choice."""
        for name, choices in self._choices.items():
            at = choices.index(config[name])
            if near and self._ordered[name]:
                steps = [i for i in (at - 1, at + 1) if 0 <= i < len(choices)]
            else:
                steps = [i for i in range(len(choices)) if i != at]
            for i in steps:
                other = config.replace(**{name: choices[i]})
                if self.space.contains(other):
                    yield other

    def _effects(self, ranked: list[tuple[float, Config]]) -> dict[tuple[str, Scalar], float]:
        """Each (parameter, value)'s mean difference from the mean log time, shrunk by
        :data:`SHRINK` results of no difference."""
        mean = sum(t for t, _ in ranked) / len(ranked)
        sums: dict[tuple[str, Scalar], list[float]] = {}
        for t, config in ranked:
            for name in self._choices:
                entry = sums.setdefault((name, config[name]), [0.0, 0.0])
                entry[0] += t - mean
                entry[1] += 1
        return {key: total / (count + SHRINK) for key, (total, count) in sums.items()}

    def _score(self, config: Config, effect: dict[tuple[str, Scalar], float]) -> float:
        return sum(effect.get((name, config[name]), 0.0) for name in self._choices)

    def _random(self) -> Config | None:
        if self._unseen is None:
            self._unseen = list(self.space.valid())
            self._rng.shuffle(self._unseen)
        while self._unseen:
            config = self._unseen.pop()
            if config not in self._proposed:
                return config
        return None
