"""Optuna TPE over categorical parameters: the default strategy.

An in-memory study per search (never RDB storage: SQLite is unsafe with several workers), a
multivariate :class:`~optuna.samplers.TPESampler`, and one ``suggest_categorical`` per parameter
(categorical beat integer-index encodings in offline replays). No config is measured twice and
no pruned config is proposed:

* warm-start configs are enqueued (``study.enqueue_trial``) and come out first, in order;
* a config the space's constraint prunes is told as ``PRUNED`` (TPE ranks those with the worst)
  and Optuna is asked again;
* a config already measured is answered from this strategy's cache, and one already proposed but
  not yet measured (batches) is told when its result arrives; Optuna is asked again;
* after ``max_attempts`` such answers in a row (default 1), the unproposed config nearest the
  last proposal (L1 distance over choice indices, ties broken by the seed) is enqueued and
  proposed instead: a repair of a pruned proposal, and local search around TPE's favourite once
  it keeps proposing measured configs. So every ask terminates within a few Optuna asks, and
  ``ask()`` returns ``None`` exactly when every config has been proposed.

Answering repeats from the cache, rather than telling them ``FAIL``, keeps TPE's model right;
enqueuing the nearest config, rather than asking TPE again and again or falling back to a random
config, was as good or better in synthetic replays and several times cheaper (TPE's cost grows
with the number of trials, repeats included).

Failed trials are told as ``FAIL`` (TPE ignores them, so they never look like winners).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import random
import warnings
from collections.abc import Iterator, Sequence
from typing import cast

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from tunecache.space import Config, Scalar, SearchSpace
from tuner.search.base import SearchStrategy, usable
from tuner.search.encoding import choice_indices

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 1  # Optuna proposals answered without measuring before the nearest is enqueued


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Raises Optuna's log level to WARNING for the block (its INFO line per trial is noise).

    Optuna's verbosity is process-global; this restores it afterwards rather than changing it for
    the whole program, but it is not thread-safe against another thread changing it meanwhile.
    """
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(max(level, optuna.logging.WARNING))
    try:
        yield
    finally:
        optuna.logging.set_verbosity(level)


class OptunaSearch(SearchStrategy):
    """Tree-structured Parzen estimator search over the space's categorical parameters.

    Example:
        >>> space = SearchSpace({"BLOCK": (16, 32, 64), "warps": (2, 4)})
        >>> search = OptunaSearch(space, seed=0, warm_start=[Config.of({"BLOCK": 64, "warps": 4})])
        >>> first = search.ask()
        >>> str(first)
        'BLOCK=64 warps=4'
        >>> search.tell(first, 1.5)
        >>> proposed = [first, *iter(search.ask, None)]
        >>> len(proposed), len(set(proposed))
        (6, 6)
    """

    name = "optuna"

    def __init__(
        self,
        space: SearchSpace,
        *,
        seed: int = 0,
        warm_start: Sequence[Config] = (),
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        super().__init__(space, seed=seed, warm_start=warm_start)
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.max_attempts = max_attempts
        self._choices = dict(space.params)
        self._distributions = {n: CategoricalDistribution(c) for n, c in self._choices.items()}
        with quiet_optuna(), warnings.catch_warnings():
            # ``multivariate`` was experimental before Optuna 4.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
            self.study = optuna.create_study(direction="minimize", sampler=sampler)
        for config in self.warm_start:
            self.study.enqueue_trial(config.to_json())
        self._rng = random.Random(seed)
        self._configs = list(space.valid())
        self._row = {config: i for i, config in enumerate(self._configs)}
        self._index = choice_indices(space, self._configs)
        self._open = np.ones(len(self._configs), dtype=bool)  # not yet proposed nor told
        self._results: dict[Config, float | None] = {}  # told: time, or None for a failure
        self._waiting: dict[Config, list[optuna.trial.Trial]] = {}  # proposed, not yet told

    def ask(self) -> Config | None:
        if not self._open.any():
            return None
        with quiet_optuna():
            config = None
            for attempt in itertools.count(1):
                if config is not None and attempt % (self.max_attempts + 1) == 0:
                    nearest = self._nearest_open(config)
                    logger.debug("optuna: %s already answered; enqueuing %s", config, nearest)
                    self.study.enqueue_trial(nearest.to_json())
                trial = self.study.ask()
                config = self._suggest(trial)
                if not self._answered(trial, config):
                    self._close(config)
                    self._waiting[config] = [trial]
                    return config
        raise AssertionError("unreachable")  # pragma: no cover

    def tell(self, config: Config, time_ms: float | None) -> None:
        time_ms = usable(time_ms)  # Optuna refuses NaN: a time nothing can use is a failure
        self._results[config] = time_ms
        self._close(config)
        trials = self._waiting.pop(config, [])
        with quiet_optuna():
            if not trials and self.space.contains(config):
                # Measured without being proposed (e.g. a default config): still worth learning.
                state = TrialState.COMPLETE if time_ms is not None else TrialState.FAIL
                self.study.add_trial(
                    optuna.trial.create_trial(
                        params=config.to_json(),
                        distributions=dict(self._distributions),
                        value=time_ms,
                        state=state,
                    )
                )
            for trial in trials:
                self._tell(trial, time_ms)

    def _indices(self, config: Config) -> list[int]:
        return [self._choices[name].index(config[name]) for name in self._choices]

    def _close(self, config: Config) -> None:
        if (row := self._row.get(config)) is not None:
            self._open[row] = False

    def _nearest_open(self, config: Config) -> Config:
        """The unproposed config nearest ``config`` in choice-index L1 distance (seeded ties)."""
        distance = np.abs(self._index - np.array(self._indices(config))).sum(axis=1)
        distance[~self._open] = np.iinfo(np.int64).max
        ties = np.flatnonzero(distance == distance.min())
        return self._configs[int(ties[self._rng.randrange(len(ties))])]

    def _suggest(self, trial: optuna.trial.Trial) -> Config:
        """One ``suggest_categorical`` per parameter: the config Optuna proposes in ``trial``."""
        values = {n: trial.suggest_categorical(n, c) for n, c in self._choices.items()}
        return Config.of(cast(dict[str, Scalar], values))  # the choices are Scalars, never None

    def _answered(self, trial: optuna.trial.Trial, config: Config) -> bool:
        """Settles ``trial`` without a measurement if it can be; whether it did."""
        reason = self.space.prune_reason(config)
        if reason is not None:
            self.study.tell(trial, state=TrialState.PRUNED)
        elif config in self._results:
            self._tell(trial, self._results[config])
        elif config in self._waiting:
            self._waiting[config].append(trial)  # told with the first one's result
        else:
            return False
        return True

    def _tell(self, trial: optuna.trial.Trial, time_ms: float | None) -> None:
        if time_ms is None:
            self.study.tell(trial, state=TrialState.FAIL)
        else:
            self.study.tell(trial, time_ms)
