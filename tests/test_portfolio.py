"""The portfolio's allocation and the local search's neighbours (the ask/tell contract every
strategy obeys is tests/test_search.py's)."""

from __future__ import annotations

from backends.base import Budget, Trial
from tests.test_search import SPACE, failing_evaluator, fake_time
from tunecache.space import Config, SearchSpace
from tuner.search import get_strategy, run_search
from tuner.search.base import SearchStrategy
from tuner.search.local import LocalSearch
from tuner.search.portfolio import PortfolioSearch

GRID = SearchSpace({"a": tuple(range(12)), "b": tuple(range(12)), "kind": ("x", "y", "z")})


def grid_time(config: Config) -> float:
    return 1.0 + abs(int(config["a"]) - 7) + abs(int(config["b"]) - 3) + (config["kind"] == "y")


def evaluate_grid(configs: list[Config]) -> list[Trial]:
    return [Trial(config=c.to_json(), status="ok", time_ms=grid_time(c)) for c in configs]


class Ordered(SearchStrategy):
    """Proposes the space in a fixed order: by ``grid_time``, fastest or slowest first."""

    name = "ordered"

    def __init__(self, space: SearchSpace, *, fastest_first: bool) -> None:
        super().__init__(space)
        self._pending = sorted(space.configs(), key=grid_time, reverse=not fastest_first)
        self.told: list[Config] = []

    def ask(self) -> Config | None:
        return self._pending.pop(0) if self._pending else None

    def tell(self, config: Config, time_ms: float | None) -> None:
        self.told.append(config)


def test_the_budget_moves_to_the_arm_that_finds_good_configs() -> None:
    for seed in range(5):
        search = PortfolioSearch(GRID, seed=seed)
        good, bad = Ordered(GRID, fastest_first=True), Ordered(GRID, fastest_first=False)
        search.arms = {"good": good, "bad": bad}
        search.wins, search.misses = {"good": 0, "bad": 0}, {"good": 0, "bad": 0}
        log = run_search(search, evaluate_grid, Budget(trials=80))
        drawn = {arm: search.wins[arm] + search.misses[arm] for arm in ("good", "bad")}
        assert drawn["good"] >= 3 * drawn["bad"]
        assert log.best is not None and grid_time(log.best[0]) == 1.0
        # Every arm was told every result, whoever proposed it.
        assert set(good.told) == set(bad.told) == {c for c, _ in log}


def test_the_prior_s_best_configs_come_first() -> None:
    prior = {c: fake_time(c) for c in SPACE.configs()}
    search = get_strategy("portfolio", SPACE, seed=0, prior=prior)
    first = search.ask()
    assert first == min(prior, key=prior.__getitem__)


def test_local_search_proposes_the_best_config_s_neighbours() -> None:
    search = LocalSearch(GRID, seed=0)
    seen = [Config.of({"a": 7, "b": 2, "kind": "y"}), Config.of({"a": 0, "b": 11, "kind": "x"})]
    for config in seen:
        search.tell(config, grid_time(config))
    near = search.ask()
    assert near is not None
    best = seen[0]
    changed = [k for k in ("a", "b", "kind") if near[k] != best[k]]
    assert len(changed) == 1  # one parameter moved
    if changed[0] in ("a", "b"):  # an ordered one: by one step
        assert abs(int(near[changed[0]]) - int(best[changed[0]])) == 1
    # Over a short run it walks down to the optimum of the bowl.
    log = run_search(LocalSearch(GRID, seed=1), evaluate_grid, Budget(trials=40))
    assert log.best is not None and grid_time(log.best[0]) == 1.0


def test_local_search_random_until_something_succeeds() -> None:
    search = LocalSearch(SPACE, seed=3)
    first = [search.ask() for _ in range(3)]
    assert len(set(first)) == 3 and all(SPACE.contains(c) for c in first if c is not None)
    # Every one failing: random configs still, each once, until the space is exhausted.
    log = run_search(LocalSearch(SPACE, seed=3), failing_evaluator(lambda c: True),
                     Budget(trials=1000))  # fmt: skip
    assert len(log) == len(set(c for c, _ in log)) == len(list(SPACE.configs()))


def test_a_failure_is_a_whole_miss_even_before_anything_succeeded() -> None:
    search = PortfolioSearch(SPACE, seed=0)
    for _ in range(12):
        config = search.ask()
        assert config is not None
        search.tell(config, None)
    assert sum(search.wins.values()) == 0.0 and sum(search.misses.values()) > 0


def test_a_config_told_from_outside_the_space_changes_nothing() -> None:
    # A default config the search never proposed, outside the space: every config of the space
    # is still proposed exactly once, and no strategy trips over it.
    outside = Config.of({"BLOCK": 256, "warps": 1, "split": 1})
    assert not SPACE.contains(outside)
    for name in ("portfolio", "local"):
        search = get_strategy(name, SPACE, seed=0)
        search.tell(outside, 0.001)  # faster than anything: it would be "the best"
        proposed = []
        while (config := search.ask()) is not None:
            proposed.append(config)
            search.tell(config, fake_time(config))
        assert sorted(map(str, proposed)) == sorted(map(str, SPACE.configs())), name
