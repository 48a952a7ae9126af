"""Each search strategy's CPU per proposal on a large space, over a tune's first 200 evaluations.

The space: 20,736 configs of seven tile-like parameters (six ordered, one categorical), timed by a
seeded synthetic function (a bowl in log tile sizes, interactions, 2 % of configs failing): the
strategy's work depends on the space's size and the number of results, not on what the times
are. An evaluation is a lookup, so the process's CPU from the strategy's construction to its
200th evaluation is the strategy's. The goal (issue 27): ≤ 5 ms a proposal, so that choosing
never takes a real share of a tune whose candidates take tens of milliseconds each.

Writes ``bench/results/search_cpu-<cpu>.md``. Figures, never pass/fail.

    python -m bench.search_cpu [--seeds 10] [--strategies random,optuna,bayes,local,portfolio]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time

from backends import Budget
from backends.base import Trial
from bench.report import write_result
from tunecache.space import Config, SearchSpace
from tunecache_cli.table import render
from tuner.search import STRATEGIES, get_strategy, run_search

EVALUATIONS = 200
SPACE = SearchSpace({
    "BLOCK_M": (16, 32, 64, 128, 256, 512),
    "BLOCK_N": (16, 32, 64, 128, 256, 512),
    "BLOCK_K": (16, 32, 64, 128),
    "num_warps": (1, 2, 4, 8),
    "num_stages": (1, 2, 3, 4),
    "GROUP_M": (1, 4, 8),
    "layout": ("row", "col", "tiled"),
})  # fmt: skip


def synthetic_time(config: Config, seed: int = 0) -> float | None:
    """A seeded, smooth-ish time in ms (``None``: the config fails)."""
    rng = random.Random(f"{seed}:{config}")
    if rng.random() < 0.02:
        return None
    m, n, k = (math.log2(float(config[p])) for p in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    warps, stages = math.log2(float(config["num_warps"])), float(config["num_stages"])
    bowl = (
        (m - 6) ** 2 + (n - 7) ** 2 + 0.5 * (k - 5) ** 2 + 0.3 * (warps - 2 - (m + n - 12) / 4) ** 2
    )
    extra = 0.2 * abs(stages - 3) + 0.1 * (config["layout"] != "tiled")
    return math.exp(0.15 * bowl + extra) * rng.lognormvariate(0.0, 0.02)


def cpu_per_proposal(strategy: str, seed: int) -> float:
    """Milliseconds of this process's CPU per proposal, construction included."""

    def evaluate(configs: list[Config]) -> list[Trial]:
        out = []
        for c in configs:
            t = synthetic_time(c)
            out.append(Trial(config=c.to_json(), status="ok", time_ms=t) if t is not None
                       else Trial(config=c.to_json(), status="runtime_error", error="fails"))  # fmt: skip
        return out

    space = SearchSpace(dict(SPACE.params))  # a tune's own: nothing walked before it
    began = time.process_time()
    log = run_search(get_strategy(strategy, space, seed=seed), evaluate, Budget(trials=EVALUATIONS))
    return 1e3 * (time.process_time() - began) / max(1, len(log))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10,
                        help="seeds per strategy (3 seeds missed the heavier seeds 3 to 9)")  # fmt: skip
    parser.add_argument("--strategies", default="random,optuna,bayes,local,portfolio")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    strategies = [s for s in args.strategies.split(",") if s]
    if unknown := [s for s in strategies if s not in STRATEGIES]:
        parser.error(f"unknown strategies {unknown}; known: {', '.join(sorted(STRATEGIES))}")
    size = sum(1 for _ in SPACE.configs())
    rows = []
    for strategy in strategies:
        per_seed = [cpu_per_proposal(strategy, seed) for seed in range(args.seeds)]
        rows.append([strategy, f"{statistics.fmean(per_seed):.2f}",
                     f"{min(per_seed):.2f}-{max(per_seed):.2f}"])  # fmt: skip
        print(f"{strategy}: {rows[-1][1]} ms", file=sys.stderr, flush=True)
    table = render(["strategy", "CPU ms/proposal", "seeds' range"], rows)
    print(table)
    if not args.no_write:
        write_result("search_cpu", "Search strategies' CPU per proposal on a large space",
                     [f"{size:,} configs (seven parameters), {EVALUATIONS} evaluations, "
                      f"{args.seeds} seeds; the process's CPU from the strategy's construction "
                      "to its last evaluation (a lookup), per proposal"], table)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
