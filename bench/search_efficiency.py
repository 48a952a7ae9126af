"""How fast each search strategy closes in on a landscape's optimum, replayed offline.

Every ``*.json`` landscape in FOLDER (recorded with :func:`tuner.landscape.record_landscape`) is
replayed as a simulated device. Per landscape and strategy, the table shows optimum / best found
after 10, 25, 50, 100 and 200 evaluations (1.0 is perfect; 0 while nothing succeeded), averaged
over seeds, and the mean number of evaluations to come within 5% of the optimum. Counts beyond a
landscape's size are capped at its size. Prints markdown and writes it to
``bench/results/search_efficiency.md``. Figures, never pass/fail.

    python -m bench.search_efficiency [FOLDER] [--seeds 10] [--strategies exhaustive,random,optuna]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends import Budget
from tunecache.errors import InvalidInput
from tuner.landscape import Landscape
from tuner.search import DEFAULT_STRATEGY, STRATEGIES, get_strategy, run_search
from tuner.search.loop import trial_time

LANDSCAPES = Path(__file__).with_name("landscapes")
RESULTS = Path(__file__).with_name("results") / "search_efficiency.md"
CHECKPOINTS = (10, 25, 50, 100, 200)
WITHIN = 0.05  # "found it": within 5% of the optimum


@dataclass(frozen=True)
class Efficiency:
    """One strategy on one landscape, averaged over seeds."""

    strategy: str
    ratios: dict[int, float]  # checkpoint -> mean of optimum / best found after that many
    evals_to_target: float  # mean evaluations to within WITHIN of the optimum; a miss counts
    missed: int  # as the whole budget, so with misses the mean is a lower bound


def measure(
    landscape: Landscape, strategy: str, seeds: int, checkpoints: Sequence[int] = CHECKPOINTS
) -> Efficiency:
    """Replays ``strategy`` on ``landscape`` once per seed, up to the largest checkpoint."""
    size = len(landscape.entries)
    optimum = landscape.optimum().time_ms or 0.0
    budget = Budget(trials=min(max(checkpoints), size))
    ratios: dict[int, list[float]] = {n: [] for n in checkpoints}
    evals: list[int] = []
    missed = 0
    for seed in range(seeds):
        search = get_strategy(strategy, landscape.search_space(), seed=seed)
        log = run_search(search, landscape.evaluator(), budget)
        for n in checkpoints:
            best = log.best_after(min(n, size))
            ratios[n].append(0.0 if best is None else optimum / best)
        target = optimum * (1 + WITHIN)
        times = [trial_time(trial) for trial in log.trials]
        hit = next((i for i, t in enumerate(times, 1) if t is not None and t <= target), None)
        missed += hit is None
        evals.append(budget.trials if hit is None else hit)
    return Efficiency(
        strategy=strategy,
        ratios={n: statistics.fmean(r) for n, r in ratios.items()},
        evals_to_target=statistics.fmean(evals),
        missed=missed,
    )


def describe(name: str, landscape: Landscape) -> str:
    """One markdown bullet: the file, what was measured, where, and how big it is."""
    key: dict[str, Any] = landscape.key
    problem = ",".join(f"{k}={v}" for k, v in dict(key.get("problem", {})).items())
    parts = (key.get("kernel", "?"), f"[{problem}]", key.get("dtype"), key.get("backend"))
    what = " ".join(str(part) for part in parts if part)
    ok = sum(1 for e in landscape.entries if e.status == "ok")
    optimum = landscape.optimum()
    return (
        f"- `{name}`: {what} on {landscape.device}; {len(landscape.entries)} configs "
        f"({ok} ok), optimum {optimum.time_ms:.4g} ms at `{optimum.config}`"
        + (f"; {landscape.note}" if landscape.note else "")
    )


def table(rows: Sequence[tuple[str, Efficiency]], checkpoints: Sequence[int]) -> list[str]:
    """A markdown table, one row per (landscape, strategy)."""
    header = ["landscape", "strategy", *[f"@{n}" for n in checkpoints], "evals to 5%"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, eff in rows:
        to_target = f"{'>' if eff.missed else ''}{eff.evals_to_target:.0f}"
        if eff.missed:
            to_target += f" ({eff.missed} missed)"
        cells = [name, eff.strategy, *[f"{eff.ratios[n]:.3f}" for n in checkpoints], to_target]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def average(results: dict[str, list[Efficiency]], strategies: Sequence[str]) -> list[Efficiency]:
    """Each strategy's figures averaged over the landscapes."""
    out = []
    for strategy in strategies:
        effs = [e for per in results.values() for e in per if e.strategy == strategy]
        out.append(
            Efficiency(
                strategy=strategy,
                ratios={n: statistics.fmean(e.ratios[n] for e in effs) for n in effs[0].ratios},
                evals_to_target=statistics.fmean(e.evals_to_target for e in effs),
                missed=sum(e.missed for e in effs),
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, default=LANDSCAPES)
    parser.add_argument("--seeds", type=int, default=10, help="replays per strategy (seeds 0..)")
    parser.add_argument("--strategies", default=f"exhaustive,random,{DEFAULT_STRATEGY}")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the markdown")
    args = parser.parse_args(argv)
    strategies = [s for s in args.strategies.split(",") if s]
    if unknown := [s for s in strategies if s not in STRATEGIES]:
        parser.error(f"unknown strategies {unknown}; known: {', '.join(sorted(STRATEGIES))}")
    paths = sorted(args.folder.glob("*.json"))
    if not paths:
        print(f"no *.json landscapes in {args.folder}", file=sys.stderr)
        return 2

    started = time.perf_counter()
    landscapes: dict[str, Landscape] = {}
    for path in paths:
        try:
            landscapes[path.stem] = Landscape.load(path)
            landscapes[path.stem].optimum()
        except InvalidInput as exc:
            print(f"skipping {path}: {exc}", file=sys.stderr)
    results: dict[str, list[Efficiency]] = {}
    for name, landscape in landscapes.items():
        results[name] = [measure(landscape, s, args.seeds) for s in strategies]
        print(f"{name}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    if not results:
        return 2

    rows = [(name, eff) for name, per in results.items() for eff in per]
    rows += [("*average*", eff) for eff in average(results, strategies)]
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join([
        "# Search efficiency: optimum / best found after n evaluations (1.0 is perfect)",
        "",
        f"- {args.seeds} seeds per strategy; counts beyond a landscape's size are capped at it;",
        f"  'evals to 5%': mean evaluations to within {WITHIN:.0%} of the optimum, '>' when some",
        f"  seeds missed within {max(CHECKPOINTS)} (a miss counts as the whole budget)",
        f"- run: {stamp}, {time.perf_counter() - started:.0f} s in all",
        "",
        "Landscapes:",
        "",
        *[describe(name, landscape) for name, landscape in landscapes.items()],
        "",
        *table(rows, CHECKPOINTS),
        "",
    ])  # fmt: skip
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
