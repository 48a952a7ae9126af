"""Bayesian optimisation over the enumerated space: a Gaussian process on log time, expected
improvement, failures as slow, and (optionally) the team's other devices as a prior.

Why this shape (offline replays of brute-forced GPU landscapes, ``bench/search_efficiency.py``):

* **It only ever proposes configs of the space that were never proposed**: the candidates are
  rows of the enumerated space with a per-row "open" flag, so no evaluation is repeated or
  outside the space, and :meth:`ask` returns ``None`` exactly when every config was proposed.
* **Encoding, chosen by the data**: in the *ordinal* encoding a parameter whose choices are all
  positive numbers (tile sizes, warps, stages) is one coordinate in [0, 1], its value's log2
  position between the smallest and largest choice, so "near" means "similar tile", which is
  what makes GPU landscapes smooth enough to model; in the *categorical* one every parameter is
  one-hot (any two choices equally far apart). A parameter with a choice that is not a positive
  number (a name, a flag, an unroll factor whose 0 means "none") is one-hot in both. Numbers are
  not always an order (a layout code, a variant number): replayed with every parameter's choices
  relabelled, the ordinal GP fell below random on some families. So each time the
  hyperparameters are searched, both encodings are, and the one whose GP explains the results
  better (marginal likelihood) is used. Where no numeric parameter has three choices or more,
  the two are the same and only one is kept.
* **Relevance**: the kernel has one length scale, but a space's parameters do not matter
  alike. So each encoding is also tried with each parameter's coordinates scaled by its
  relevance, the spread of its values' mean results (main effects, the largest 1, none below
  :data:`RELEVANCE_FLOOR`): a cheap stand-in for a length scale per parameter, kept only where
  the marginal likelihood prefers it. On a skinny TVM matmul (64x1024x1024, where TPE led) it
  lifted the search from 0.86 to 0.88 of the optimum at 25 evaluations, and from 0.71 to 0.78
  on its relabelled twin (10 seeds).
* **Surrogate**: a GP with a Matérn-5/2 kernel on standardised log time; its encoding, length
  scale and noise are chosen by marginal likelihood on a small grid, searched again as the trials
  grow.
* **Failures teach**: a failed config is told to the model as slower than the slowest success,
  so the region around failures looks bad and is proposed less (random search does not learn).
* **Acquisition**: expected improvement over the best time so far, evaluated on every open
  config (or, in a large space, a seeded sample plus every neighbour of the best few).
* **Transfer** (``prior``): scores of configs measured on other devices or shapes (lower is
  better, any scale). The first proposals are the prior's best configs, and the GP models the
  difference between this device and a linear fit of the prior — so what other GPUs taught is
  used until this device's own measurements say otherwise.
* **The initial sample is spread** over the space: after a random first config, each is the open
  config that differs from its nearest taken one in the most parameters, then the one whose
  choices were taken least often, so each parameter's choices come roughly equally often (as in a
  Latin square: ``k`` configs of ``k``-choice parameters take each choice once). Against a random
  sample, in the portfolio, replayed cold on the 16 families (30 seeds, the relabelled twins
  included): 0.949 of the optimum on average at 25 evaluations, against 0.942, and 0.931 at 2 % of
  the space, against 0.915; ahead on 13 families at 25, behind on 3
  (bench/results/search_efficiency_spread_start.md): ten random configs repeat choices and leave
  whole regions unseen, and the models start from them.

Deterministic under a seed (the seeded initial sample and candidate sample; numpy otherwise).
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy.linalg import lapack, solve_triangular

from tunecache.space import Config, SearchSpace
from tuner.search.base import SearchStrategy, usable
from tuner.search.encoding import choice_indices, is_ordered

LENGTH_SCALES = (0.08, 0.15, 0.25, 0.4, 0.6, 1.0)
NOISES = (1e-4, 1e-2, 1e-1)  # variance, in standardised units
REFIT_GROWTH = 1.25  # the hyperparameters are searched again when the trials grow by this
INITIAL = 10  # configs before the model (at most a quarter of the space, >= 1)
SPREAD_UP_TO = 40  # configs taken up to which the next initial one is spread (later: random)
SPREAD_POOL = 4000  # open configs scored for the spread (a seeded sample of a larger space)
RELEVANCE_FLOOR = 0.1  # the least weight a parameter keeps in a relevance-scaled encoding
POOL = 1024  # open configs scored per ask in a large space (plus the best ones' neighbours)
FAILURE_MARGIN = 1.0  # a failure is told as this much slower (log e) than the slowest success


@functools.cache
def _blas() -> Any:
    """threadpoolctl's controller of the loaded BLAS libraries (made once: it scans them), or
    ``None`` without threadpoolctl."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    return ThreadpoolController()


def one_blas_thread() -> contextlib.AbstractContextManager[Any]:
    """numpy's BLAS on one thread for the block: the model's products are small, and OpenBLAS's
    threads, spinning between them, doubled the CPU a proposal took (9.1 against 4.4 ms on a
    2-core EPYC) and took a core from the process that times candidates."""
    controller = _blas()
    if controller is None:
        return contextlib.nullcontext()
    return controller.limit(limits=1, user_api="blas")


def encode(space: SearchSpace, index: np.ndarray, *, ordinal: bool = True) -> np.ndarray:
    """Configs (as :func:`~tuner.search.encoding.choice_indices` rows) as points, per parameter
    with several choices: one coordinate in [0, 1] (its log2 position) when ``ordinal`` and every
    choice is a positive number, else one-hot columns scaled so that two choices are 1 apart.

    Example:
        >>> space = SearchSpace({"BLOCK": (16, 32, 64), "kind": ("a", "b")})
        >>> encode(space, np.asarray([[0, 0], [2, 1]])).round(3).tolist()
        [[0.0, 0.707, 0.0], [1.0, 0.0, 0.707]]
    """
    columns = []
    for j, choices, on_scale in _layout(space, ordinal):
        if on_scale:
            logs = np.log2(np.asarray(choices, dtype=float))
            position = (logs - logs.min()) / ((logs.max() - logs.min()) or 1.0)
            columns.append(position[index[:, j], None])
        else:
            columns.append(np.eye(len(choices))[index[:, j]] / math.sqrt(2.0))
    if not columns:
        return np.zeros((len(index), 1))
    return np.concatenate(columns, axis=1)


def _layout(space: SearchSpace, ordinal: bool) -> list[tuple[int, Sequence[Any], bool]]:
    """Per parameter with several choices: its position in ``space.params``, its choices, and
    whether :func:`encode` gives it one log2 coordinate (else one-hot columns)."""
    return [(j, choices, ordinal and _positive_numbers(choices))
            for j, choices in enumerate(space.params.values()) if len(choices) > 1]  # fmt: skip


def owners(space: SearchSpace, *, ordinal: bool = True) -> np.ndarray:
    """The parameter (its position in ``space.params``) each column of :func:`encode` is of.

    Example:
        >>> owners(SearchSpace({"BLOCK": (16, 32, 64), "one": (1,), "kind": ("a", "b")})).tolist()
        [0, 2, 2]
    """
    columns: list[int] = []
    for j, choices, on_scale in _layout(space, ordinal):
        columns += [j] * (1 if on_scale else len(choices))
    return np.asarray(columns, dtype=np.int64)


def relevance(index: np.ndarray, y: np.ndarray) -> np.ndarray | None:
    """Each parameter's weight: the spread (root mean square, by count) of its values' mean ``y``
    around the mean, over the largest such spread, at least :data:`RELEVANCE_FLOOR`; ``None``
    when no parameter's values differ in mean.

    Example:
        >>> index = np.asarray([[0, 0], [0, 1], [1, 0], [1, 1]])
        >>> relevance(index, np.asarray([0.0, 0.1, 1.0, 1.1])).round(2).tolist()
        [1.0, 0.1]
    """
    weights = np.zeros(index.shape[1])
    for j in range(index.shape[1]):
        _, inverse, counts = np.unique(index[:, j], return_inverse=True, return_counts=True)
        if len(counts) > 1:
            means = np.bincount(inverse, weights=y) / counts
            weights[j] = math.sqrt(float(np.average((means - y.mean()) ** 2, weights=counts)))
    top = float(weights.max(initial=0.0))
    return None if top <= 0 else np.maximum(weights / top, RELEVANCE_FLOOR)


def _positive_numbers(choices: Sequence[Any]) -> bool:
    """Whether every choice is a positive number: then it has a log2 position on a scale."""
    return is_ordered(choices) and all(float(c) > 0 for c in choices)


def distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The Euclidean distances between the rows of ``a`` and ``b``."""
    r = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :]
    r -= 2.0 * (a @ b.T)
    np.maximum(r, 0.0, out=r)
    np.sqrt(r, out=r)
    return r


def matern52(a: np.ndarray, b: np.ndarray, length: float) -> np.ndarray:
    """The Matérn-5/2 kernel between the rows of ``a`` and ``b`` (unit variance)."""
    return matern52_of(distances(a, b), length)


def matern52_of(r: np.ndarray, length: float) -> np.ndarray:
    """The Matérn-5/2 kernel of the distances ``r``, which it overwrites (in place: it is
    scored on a thousand candidates an ask; pass a copy to keep them)."""
    r *= math.sqrt(5.0) / length
    k = r / 3.0
    k += 1.0
    k *= r
    k += 1.0
    np.negative(r, out=r)
    np.exp(r, out=r)
    k *= r
    return k


def log_likelihood(kernel: np.ndarray, y: np.ndarray, noise: float) -> float:
    """The log marginal likelihood of ``y`` under ``kernel`` plus ``noise`` (up to a constant),
    from the Cholesky factor alone: a model search scores 72 fits an ask, and the inverse
    that prediction needs was more than half of their time.

    Raises:
        numpy.linalg.LinAlgError: the kernel plus noise is not positive definite.
    """
    chol = np.linalg.cholesky(kernel + noise * np.eye(len(y)))
    z = solve_triangular(chol, y, lower=True, check_finite=False)
    return float(-0.5 * z @ z - np.log(np.diag(chol)).sum())


class _GP:
    """A zero-mean GP on standardised targets, with a fixed length scale and noise."""

    def __init__(self, x: np.ndarray, y: np.ndarray, length: float, noise: float) -> None:
        self.x, self.length = x, length
        chol = np.linalg.cholesky(matern52(x, x, length) + noise * np.eye(len(x)))
        # The factor's inverse (a triangular one: a sixth of a general inverse's work), so
        # that prediction is two matrix products.
        self.chol_inv, info = lapack.dtrtri(chol, lower=1)
        if info:
            raise np.linalg.LinAlgError(f"the kernel's Cholesky factor is singular ({info})")
        self.alpha = self.chol_inv.T @ (self.chol_inv @ y)

    def predict(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cross = matern52(points, self.x, self.length)
        mean = cross @ self.alpha
        v = self.chol_inv @ cross.T
        var = np.maximum(1.0 - (v * v).sum(0), 1e-12)
        return mean, np.sqrt(var)


def _normal_pdf(z: np.ndarray) -> np.ndarray:
    return np.asarray(np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi))


def _erfc(x: np.ndarray) -> np.ndarray:
    """The complementary error function, vectorised (Numerical Recipes' Chebyshev fit, relative
    error below 1.2e-7): ``math.erf`` element by element cost a millisecond per 2,000."""
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * a)
    poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))  # fmt: skip
    y = t * np.exp(-a * a + poly)
    return np.asarray(np.where(x >= 0, y, 2.0 - y))


def _normal_cdf(z: np.ndarray) -> np.ndarray:
    return np.asarray(0.5 * _erfc(-z / math.sqrt(2.0)))


def expected_improvement(mean: np.ndarray, std: np.ndarray, best: float) -> np.ndarray:
    """EI of minimising below ``best`` under N(mean, std²)."""
    z = (best - mean) / std
    return np.asarray((best - mean) * _normal_cdf(z) + std * _normal_pdf(z))


class BayesSearch(SearchStrategy):
    """GP Bayesian optimisation over the space's configs (see the module docstring).

    Args:
        prior: a score per config from other devices or shapes (lower is better); optional.
        initial: configs proposed before the model is used (spread over the space while at
            most :data:`SPREAD_UP_TO` configs are taken, random after; or the prior's best).

    Example:
        >>> space = SearchSpace({"BLOCK": (16, 32, 64, 128), "warps": (2, 4, 8)})
        >>> search = BayesSearch(space, seed=0)
        >>> proposed = []
        >>> while (config := search.ask()) is not None:
        ...     proposed.append(config)
        ...     search.tell(config, abs(config["BLOCK"] - 64) + config["warps"] + 1.0)
        >>> len(proposed), len(set(proposed))
        (12, 12)
    """

    name = "bayes"
    uses_prior = True

    def __init__(
        self,
        space: SearchSpace,
        *,
        seed: int = 0,
        warm_start: Sequence[Config] = (),
        prior: Mapping[Config, float] | None = None,
        initial: int | None = None,
    ) -> None:
        super().__init__(space, seed=seed, warm_start=warm_start)
        self._configs = list(space.valid())
        self._row = {config: i for i, config in enumerate(self._configs)}
        self._index = choice_indices(space, self._configs)
        kinds = [True]
        if any(len(c) > 2 and _positive_numbers(c) for c in space.params.values()):
            kinds.append(False)  # numbers that may be names: a categorical encoding too
        self._encodings = {
            "ordinal" if ordinal else "categorical": (
                encode(space, self._index, ordinal=ordinal), owners(space, ordinal=ordinal))
            for ordinal in kinds
        }  # fmt: skip
        self.encoding = "ordinal"  # the one in use: chosen with the hyperparameters
        self.weights: np.ndarray | None = None  # its relevance per parameter, if weighted
        self._x = self._encodings["ordinal"][0]
        self._open = np.ones(len(self._configs), dtype=bool)
        self._times: dict[int, float | None] = {}  # told rows: log time, None for a failure
        self._rng = random.Random(seed)
        self._sampler = np.random.default_rng(seed)  # the candidate pool of a large space
        size = len(self._configs)
        self.initial = initial if initial is not None else min(INITIAL, max(1, size // 4))
        self._prior = self._prior_column(prior) if prior else None
        self._hyper = (0.25, 1e-2)
        self._told_at_fit = 0

    # -- the ask/tell interface --------------------------------------------------------------
    def ask(self) -> Config | None:
        if not self._open.any():
            return None
        warm = self.next_warm(lambda c: not self._open[self._row[c]])
        row = None if warm is None else self._row[warm]
        if row is None:
            successes = sum(1 for t in self._times.values() if t is not None)
            proposed = len(self._configs) - int(self._open.sum())
            if proposed < self.initial or successes < 2:
                row = self._initial_row()
            else:
                row = self._model_row()
        self._open[row] = False
        return self._configs[row]

    def tell(self, config: Config, time_ms: float | None) -> None:
        row = self._row.get(config)
        if row is None:  # measured outside the space (a default config): nothing to model
            return
        self._open[row] = False
        time_ms = usable(time_ms)
        self._times[row] = None if time_ms is None else math.log(time_ms)

    # -- proposals ---------------------------------------------------------------------------
    def _initial_row(self) -> int:
        open_rows = np.flatnonzero(self._open)
        if self._prior is not None:  # the other devices' best configs first
            return int(open_rows[np.argmin(self._prior[open_rows])])
        taken = np.flatnonzero(~self._open)
        if not 0 < len(taken) <= SPREAD_UP_TO:
            return int(open_rows[self._rng.randrange(len(open_rows))])
        return self._spread_row(open_rows, taken)

    def _spread_row(self, open_rows: np.ndarray, taken: np.ndarray) -> int:
        """The open config least like those taken: the most parameters set otherwise than in
        the nearest taken config (Hamming distance over choices), then the choices taken
        least often; ties broken by the seed. Scored on a seeded sample of a large space."""
        pool = open_rows
        if len(pool) > SPREAD_POOL:
            pool = pool[self._rng.sample(range(len(pool)), SPREAD_POOL)]
        index = self._index
        nearest = (index[pool][:, None, :] != index[taken][None, :, :]).sum(axis=2).min(axis=1)
        used = np.zeros(len(pool))
        for j, choices in enumerate(self.space.params.values()):
            used += np.bincount(index[taken, j], minlength=len(choices))[index[pool, j]]
        score = nearest * (used.max() + 1) - used  # the distance first, then the least used
        ties = np.flatnonzero(score == score.max())
        return int(pool[ties[self._rng.randrange(len(ties))]])

    def _model_row(self) -> int:
        with one_blas_thread():
            return self._model_row_unlimited()

    def _model_row_unlimited(self) -> int:
        rows = np.asarray(sorted(self._times), dtype=np.int64)
        values = np.asarray([np.nan if (t := self._times[r]) is None else t for r in rows])
        good = ~np.isnan(values)
        values[~good] = values[good].max() + FAILURE_MARGIN
        baseline = self._baseline(rows[good], values[good])
        target = values - baseline[rows]
        center, scale = float(target.mean()), float(target.std()) or 1.0
        y = (target - center) / scale
        gp = self._fit(rows, y)
        candidates = self._candidates(rows[good], values[good])
        mean, std = gp.predict(self._x[candidates])
        mean = mean * scale + center + baseline[candidates]
        score = expected_improvement(mean, std * scale, float(values[good].min()))
        return int(candidates[int(np.argmax(score))])

    def _baseline(self, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
        """The prior's prediction of log time (a linear fit on this device's successes), or 0."""
        if self._prior is None or len(rows) < 3:
            return np.zeros(len(self._configs))
        p = self._prior[rows]
        slope, intercept = np.polyfit(p, values, 1) if np.ptp(p) > 0 else (0.0, values.mean())
        slope = max(float(slope), 0.0)  # a prior is never read upside down
        return np.asarray(intercept + slope * self._prior)

    def _fit(self, rows: np.ndarray, y: np.ndarray) -> _GP:
        """The GP of ``y`` at ``rows``; its encoding and hyperparameters are searched again (by
        marginal likelihood) when the trials have grown by :data:`REFIT_GROWTH`."""
        told = len(self._times)
        if told >= REFIT_GROWTH * self._told_at_fit:
            self._told_at_fit = told
            self._search_model(rows, y)
        length, noise = self._hyper
        try:
            return _GP(self._x[rows], y, length, noise)
        except np.linalg.LinAlgError:
            return _GP(self._x[rows], y, length, max(noise, 1e-1))

    def _search_model(self, rows: np.ndarray, y: np.ndarray) -> None:
        """Every encoding, plain and scaled by relevance, with every length scale and noise of
        the grid: the most likely becomes the model's."""
        weights = relevance(self._index[rows], y)
        fits = []
        for name, (x, owner) in self._encodings.items():
            for w in (None, weights) if weights is not None else (None,):
                told = x[rows] if w is None else x[rows] * w[owner][None, :]  # the rows only
                distance = distances(told, told)
                for length in LENGTH_SCALES:
                    kernel = matern52_of(distance.copy(), length)
                    for noise in NOISES:
                        try:
                            likelihood = log_likelihood(kernel, y, noise)
                        except np.linalg.LinAlgError:
                            continue
                        fits.append((likelihood, name, w is not None, length, noise))
        if not fits:
            return
        _, self.encoding, weighted, length, noise = max(fits, key=lambda fit: fit[0])
        x, owner = self._encodings[self.encoding]
        self.weights = weights if weighted else None
        self._x = x if self.weights is None else x * self.weights[owner][None, :]
        self._hyper = (length, noise)

    def _candidates(self, good_rows: np.ndarray, good_values: np.ndarray) -> np.ndarray:
        """Every open row; in a large space a seeded sample plus the best rows' neighbours."""
        open_rows = np.flatnonzero(self._open)
        if len(open_rows) <= POOL:
            return open_rows
        sample = open_rows[np.sort(self._sampler.choice(len(open_rows), POOL, replace=False))]
        best = good_rows[np.argsort(good_values)[:3]]
        # One parameter apart from one of the best, of the open rows (the others are spent).
        # Compared over every row, not the open ones picked out: a tenth of the time.
        apart = (self._index[:, None, :] != self._index[None, best, :]).sum(2, dtype=np.int16)
        neighbours = np.flatnonzero((apart == 1).any(1) & self._open)
        return np.unique(np.concatenate([sample, neighbours]))

    def _prior_column(self, prior: Mapping[Config, float]) -> np.ndarray:
        """The prior per row, as log scores (rows without one get the median)."""
        scores = [prior.get(c) for c in self._configs]
        known = [math.log(s) for s in scores if s is not None and s > 0 and math.isfinite(s)]
        fill = float(np.median(known)) if known else 0.0
        return np.asarray(
            [math.log(s) if s is not None and s > 0 and math.isfinite(s) else fill for s in scores]
        )
