"""The model-based strategy: never a repeat, learns from failures, uses a prior, replays cheaply."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable

import numpy as np
import pytest

from backends.base import Budget, Trial
from tunecache.space import Config, SearchSpace
from tuner.landscape import Landscape, entry
from tuner.search import get_strategy, run_search
from tuner.search.bayes import _GP, BayesSearch, log_likelihood, matern52

SPACE = SearchSpace({"BLOCK_M": (16, 32, 64, 128, 256), "BLOCK_N": (16, 32, 64, 128, 256),
                     "warps": (1, 2, 4, 8), "stages": (2, 3, 4, 5)})  # fmt: skip


def bowl(config: Config) -> float:
    """A smooth landscape with its optimum at 64 x 128, 4 warps, 3 stages."""
    return 1.0 + sum(
        (math.log2(float(config[name])) - math.log2(best)) ** 2
        for name, best in (("BLOCK_M", 64), ("BLOCK_N", 128), ("warps", 4), ("stages", 3))
    )


def fails(config: Config) -> bool:
    """A failed region: the largest tiles (as shared memory overflows do)."""
    return int(config["BLOCK_M"]) * int(config["BLOCK_N"]) >= 128 * 128


def evaluator(time_of: Callable[[Config], float]) -> Callable[[list[Config]], list[Trial]]:
    def evaluate(configs: list[Config]) -> list[Trial]:
        return [Trial(config=c.to_json(), status="runtime_error", error="out of resources")
                if fails(c) else Trial(config=c.to_json(), status="ok", time_ms=time_of(c))
                for c in configs]  # fmt: skip

    return evaluate


def test_a_failed_region_is_proposed_less_than_random_would() -> None:
    share = sum(fails(c) for c in SPACE.configs()) / sum(1 for _ in SPACE.configs())
    proposed_bad = []
    for seed in range(5):
        log = run_search(BayesSearch(SPACE, seed=seed), evaluator(bowl), Budget(trials=60))
        configs = [c for c, _ in log]
        assert len(configs) == len(set(configs)) and all(SPACE.contains(c) for c in configs)
        proposed_bad.append(sum(fails(c) for c in configs) / len(configs))
    assert statistics.fmean(proposed_bad) < 0.5 * share  # random sampling's expectation: share


def test_it_finds_the_bowls_optimum_sooner_than_random() -> None:
    def evals_to_optimum(name: str, seed: int) -> int:
        log = run_search(get_strategy(name, SPACE, seed=seed), evaluator(bowl), Budget(trials=400))
        return next(i for i, (_, t) in enumerate(log, 1) if t.time_ms == 1.0)

    bayes = statistics.fmean(evals_to_optimum("bayes", s) for s in range(3))
    shuffled = statistics.fmean(evals_to_optimum("random", s) for s in range(3))
    assert bayes < shuffled / 2


def test_the_same_seed_proposes_the_same_configs() -> None:
    def run(seed: int) -> list[Config]:
        log = run_search(BayesSearch(SPACE, seed=seed), evaluator(bowl), Budget(trials=30))
        return [c for c, _ in log]

    assert run(4) == run(4) and run(4) != run(5)


def test_the_initial_sample_spreads_over_every_parameters_choices() -> None:
    # Four parameters of four choices (numbers, names and a mix): four spread configs take
    # each choice once, as a Latin square does. Random ones would repeat some (p > 0.99).
    space = SearchSpace({"BLOCK": (16, 32, 64, 128), "warps": (1, 2, 4, 8),
                         "order": ("row", "col", "tile", "swizzle"), "split": (1, 2, 3, 0)})  # fmt: skip
    designs = set()
    for seed in range(5):
        search = BayesSearch(space, seed=seed, initial=4)
        design = [search.ask() for _ in range(4)]
        for name, choices in space.params.items():
            assert sorted(map(str, (c[name] for c in design))) == sorted(map(str, choices)), name
        designs.add(tuple(design))
    assert len(designs) == 5  # the seed still decides which spread configs


def test_a_prior_from_another_device_is_used() -> None:
    # Another device with the same shape of landscape, measured slower everywhere.
    prior = {c: 3.0 * bowl(c) for c in SPACE.configs()}
    warm = BayesSearch(SPACE, seed=0, prior=prior)
    first = warm.ask()
    assert first is not None and bowl(first) == 1.0  # the prior's best comes first
    cold = run_search(BayesSearch(SPACE, seed=0), evaluator(bowl), Budget(trials=10))
    assert min(t.time_ms or math.inf for _, t in cold) > 1.0  # cold: not found in 10


def generated_landscape(recorded: int, seed: int = 0) -> Landscape:
    """A landscape of ``recorded`` configs from a product over a thousand times larger."""
    params = {f"p{i}": tuple(range(1, 9)) for i in range(7)}  # 8**7 = 2,097,152 configs
    rng = random.Random(seed)
    configs = {Config.of({n: rng.choice(c) for n, c in params.items()}) for _ in range(recorded)}
    entries = [entry(c.to_json(), "ok", (1.0 + sum(float(v) for v in c.values()),))
               for c in configs]  # fmt: skip
    return Landscape(key={"kernel": "generated"}, space={n: list(c) for n, c in params.items()},
                     entries=entries, device="synthetic")  # fmt: skip


@pytest.mark.parametrize("strategy", ["bayes", "optuna", "random", "exhaustive"])
def test_replay_cost_follows_the_recorded_configs_not_the_product(
    strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    landscape = generated_landscape(2000)
    space = landscape.search_space()
    assert space.size >= 1000 * len(landscape.entries)

    def never(self: SearchSpace) -> None:
        raise AssertionError("the replay walked the whole product")

    monkeypatch.setattr(SearchSpace, "all_configs", never)
    started = time.perf_counter()
    search = get_strategy(strategy, space, seed=0)
    log = run_search(search, landscape.evaluator(), Budget(trials=30))
    assert len(log) == 30 and all(space.contains(c) for c, _ in log)
    assert time.perf_counter() - started < 30  # a hang check; bench/ measures the set-up time


def test_the_encoding_follows_the_data_order_or_names() -> None:
    # The same bowl, once over tile sizes in their order and once with each parameter's numbers
    # relabelled (numbers that are names): the model keeps the order where it explains the
    # times, and drops it where it does not.
    rng = random.Random(0)
    relabel = {name: dict(zip(choices, rng.sample(choices, len(choices)), strict=True))
               for name, choices in SPACE.params.items()}  # fmt: skip

    def named(config: Config) -> float:
        return bowl(Config.of({k: relabel[k][v] for k, v in config.items()}))

    chosen = {}
    for label, time_of in (("ordered", bowl), ("named", named)):
        search = BayesSearch(SPACE, seed=0)
        run_search(search, timed(time_of), Budget(trials=60))
        chosen[label] = search.encoding
    assert chosen == {"ordered": "ordinal", "named": "categorical"}


def timed(time_of: Callable[[Config], float]) -> Callable[[list[Config]], list[Trial]]:
    """An evaluator where every config succeeds in ``time_of`` it."""

    def evaluate(configs: list[Config]) -> list[Trial]:
        return [Trial(config=c.to_json(), status="ok", time_ms=time_of(c)) for c in configs]

    return evaluate


def test_a_parameter_that_decides_the_time_weighs_most() -> None:
    # Only BLOCK_M matters (a steep valley in it); the others are noise-free bystanders. The
    # model keeps the relevance-scaled encoding, with BLOCK_M's weight the largest, the rest low.
    def valley(config: Config) -> float:
        return 1.0 + 4.0 * abs(math.log2(float(config["BLOCK_M"])) - 5.0)

    others = []
    for seed in range(5):  # one seed's bystanders can weigh up to 0.9 by chance
        search = BayesSearch(SPACE, seed=seed)
        run_search(search, timed(valley), Budget(trials=40))
        assert search.weights is not None
        weights = dict(zip(SPACE.params, search.weights, strict=True))
        assert weights["BLOCK_M"] == 1.0
        assert max(w for name, w in weights.items() if name != "BLOCK_M") < 0.95
        others.append(statistics.fmean(w for name, w in weights.items() if name != "BLOCK_M"))
    assert statistics.fmean(others) < 0.5


def test_the_likelihood_and_the_prediction_are_the_textbook_formulas() -> None:
    # Both are computed from the kernel's Cholesky factor (a triangular solve, a triangular
    # inverse): the same numbers as the explicit inverse and determinant.
    rng = np.random.default_rng(3)
    x, y, points = rng.random((30, 4)), rng.standard_normal(30), rng.random((7, 4))
    length, noise = 0.4, 1e-2
    kernel = matern52(x, x, length) + noise * np.eye(30)
    _, log_det = np.linalg.slogdet(kernel)
    expected = -0.5 * y @ np.linalg.solve(kernel, y) - 0.5 * log_det
    assert log_likelihood(matern52(x, x, length), y, noise) == pytest.approx(expected, rel=1e-9)
    cross = matern52(points, x, length)
    mean, std = _GP(x, y, length, noise).predict(points)
    np.testing.assert_allclose(mean, cross @ np.linalg.solve(kernel, y), rtol=1e-9)
    variance = 1.0 - np.einsum("ij,ji->i", cross, np.linalg.solve(kernel, cross.T))
    np.testing.assert_allclose(std, np.sqrt(variance), rtol=1e-7)
