"""The portfolio's allocation and the local search's neighbours (the ask/tell contract every
strategy obeys is tests/test_search.py's)."""

from __future__ import annotations

from collections.abc import Callable

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


def ranked_time(config: Config) -> float:
    """A distinct time per config of GRID: the fastest is a=0, b=0, kind=x."""
    return 1.0 + 36 * int(config["a"]) + 3 * int(config["b"]) + "xyz".index(str(config["kind"]))


class Stepper(SearchStrategy):
    """Proposes by ``ranked_time``: ``improving``, the slowest config still faster than every
    result it was told (each proposal moves the best a little); else the fastest config slower
    than the best (a good config, better than most, that never moves the best)."""

    name = "stepper"

    def __init__(self, space: SearchSpace, *, improving: bool) -> None:
        super().__init__(space)
        self.improving = improving
        self.told: dict[Config, float | None] = {}

    def ask(self) -> Config | None:
        left = sorted((c for c in self.space.configs() if c not in self.told), key=ranked_time)
        best = min((t for t in self.told.values() if t is not None), default=float("inf"))
        faster = [c for c in left if ranked_time(c) < best]
        if self.improving and faster:
            return faster[-1]
        behind = [c for c in left if ranked_time(c) > best]
        return behind[0] if behind else (left[0] if left else None)

    def tell(self, config: Config, time_ms: float | None) -> None:
        self.told[config] = time_ms


def test_the_budget_moves_to_the_arm_that_improves_the_best() -> None:
    for seed in range(5):
        search = PortfolioSearch(GRID, seed=seed)
        good, bad = Stepper(GRID, improving=True), Stepper(GRID, improving=False)
        search.arms = {"good": good, "bad": bad}
        search.wins, search.misses = {"good": 0, "bad": 0}, {"good": 0, "bad": 0}
        evaluate = lambda configs: [Trial(config=c.to_json(), status="ok",  # noqa: E731
                                          time_ms=ranked_time(c)) for c in configs]  # fmt: skip
        log = run_search(search, evaluate, Budget(trials=50))
        drawn = {arm: search.wins[arm] + search.misses[arm] for arm in ("good", "bad")}
        assert drawn["good"] + drawn["bad"] == 50 - search.initial
        assert drawn["good"] >= 3 * drawn["bad"], drawn
        assert search.wins["bad"] == 0  # near the best is not progress
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


def local_draws(local_after: int) -> list[int]:
    """How many configs had been proposed each time the local arm was asked, over 60 trials."""
    search = PortfolioSearch(GRID, seed=1, local_after=local_after)
    local = search.arms["local"]
    asked_at: list[int] = []
    original: Callable[[], Config | None] = local.ask

    def ask() -> Config | None:
        asked_at.append(len(search._proposed))
        return original()

    local.ask = ask  # type: ignore[method-assign]
    run_search(search, evaluate_grid, Budget(trials=60))
    return asked_at


def test_the_local_arm_polishes_only_after_local_after_proposals() -> None:
    late, early = local_draws(25), local_draws(0)
    assert late and min(late) >= 25
    assert early and min(early) < 25  # the setting is what held it back
