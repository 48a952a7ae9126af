"""How fast each search strategy closes in on a landscape's optimum, replayed offline.

Every ``*.json`` / ``*.json.gz`` landscape in each FOLDER (recorded with
:func:`tuner.landscape.record_landscape`, or converted brute-force caches) is replayed as a
simulated device. Per landscape and strategy, the table shows optimum / best found after 25, 50,
100 and 200 evaluations and after 1 %, 2 % and 5 % of the landscape's valid (recorded) configs
(1.0 is perfect; 0 while nothing succeeded), averaged over seeds, and the mean number of
evaluations to come within 5 % of the optimum. Counts beyond a landscape's size are capped at it.

``--transfer``: each landscape is also searched with the other landscapes of its family (the same
kernel and parameters, other devices) as prior knowledge — the team cache's trials on other
GPUs: strategies that model the space (``bayes``, ``portfolio``) take the other devices'
normalised times as a prior; the others start from the prior's 10 best configs (a warm
start).

A strategy is judged by family too (the landscapes of one kernel over the same parameters, on
several devices or shapes): each family's mean, the worst family's and the families' average,
so that a family with many landscapes does not outvote the others; and by its CPU per proposal
(a replayed evaluation is a lookup, so the CPU spent is the strategy's). Below each by-family
table, the default strategy is held to the better of ``optuna`` and ``random`` less 0.01 in each
family at each fixed count: the cells below that bar, each with twice its standard error.

Prints markdown and writes it to ``bench/results/search_efficiency.md``. Figures, never
pass/fail.

    python -m bench.search_efficiency [FOLDER ...] [--seeds 10] [--strategies random,optuna,bayes]
        [--fractions 0.01,0.02,0.05] [--scrambled] [--only NAME,...]
        [--transfer] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends import Budget
from backends.base import Trial
from bench.report import machine
from tunecache.errors import InvalidInput
from tunecache.space import Config
from tuner.landscape import Landscape
from tuner.search import DEFAULT_STRATEGY, STRATEGIES, get_strategy, run_search
from tuner.search.loop import trial_time
from tuner.warm_start import relative_scores

LANDSCAPES = Path(__file__).with_name("landscapes")
RESULTS = Path(__file__).with_name("results") / "search_efficiency.md"
CHECKPOINTS = (25, 50, 100, 200)
FRACTIONS = (0.01, 0.02, 0.05)  # of the valid configs
WARM_FROM_PRIOR = 10  # warm-start configs for strategies without a model
WITHIN = 0.05  # "found it": within 5% of the optimum
CPU_PROPOSALS = 200  # the strategy's CPU is reported per proposal over this many
# The bar a default is held to (issue 27): at each fixed count, each family's mean at least the
# better of these strategies' less BAR_SLACK.
BAR_AGAINST = ("optuna", "random")
BAR_SLACK = 0.01


class _CpuUpTo:
    """An evaluator that notes the process's CPU from its creation (the strategy's, from its
    construction: a replayed evaluation is a lookup) until the ``limit``-th evaluation."""

    def __init__(self, evaluate: Callable[[list[Config]], list[Trial]], limit: int) -> None:
        self._evaluate, self.limit = evaluate, limit
        self._began = time.process_time()
        self.cpu_s, self.counted = 0.0, 0

    def evaluate(self, configs: list[Config]) -> list[Trial]:
        if self.counted < self.limit:
            self.counted += len(configs)
            self.cpu_s = time.process_time() - self._began
        return self._evaluate(configs)


@dataclass(frozen=True)
class Efficiency:
    """One strategy on one landscape, averaged over seeds."""

    strategy: str
    ratios: dict[str, float]  # checkpoint label ("@25", "2%") -> mean of optimum / best found
    evals_to_target: float  # mean evaluations to within WITHIN of the optimum; a miss counts
    missed: int  # as the whole budget, so with misses the mean is a lower bound
    cpu_ms: float = 0.0  # the strategy's CPU per proposal over the first CPU_PROPOSALS, ms
    errors: dict[str, float] = dataclasses.field(default_factory=dict)  # label -> standard
    # error of the mean over seeds (0 with one seed)


def checkpoints_of(size: int, fractions: Sequence[float] = FRACTIONS) -> dict[str, int]:
    """Label -> evaluations: the fixed counts, then the ``fractions`` of ``size`` (≥ 1)."""
    marks = {f"@{n}": n for n in CHECKPOINTS}
    marks.update({f"{f:.0%}": max(1, round(f * size)) for f in fractions})
    return marks


def prior_for(target: str, family: dict[str, Landscape]) -> dict[Config, float]:
    """The other landscapes' knowledge of ``target``'s configs, scored as the tuner scores the
    cache's trials on other devices (:func:`tuner.warm_start.relative_scores`)."""
    return relative_scores(
        dict(zip(other.configs(), (trial.time_ms for trial in other.entries), strict=True))
        for name, other in family.items()
        if name != target
    )


def measure(
    landscape: Landscape,
    strategy: str,
    seeds: int,
    prior: dict[Config, float] | None = None,
    fractions: Sequence[float] = FRACTIONS,
    settings: Mapping[str, Any] | None = None,
) -> Efficiency:
    """Replays ``strategy`` on ``landscape`` once per seed, up to the largest checkpoint
    (``settings``: keyword arguments of the strategy's class, for :mod:`bench.search_lofo`)."""
    size = len(landscape.entries)
    marks = checkpoints_of(size, fractions)
    optimum = landscape.optimum().time_ms or 0.0
    budget = Budget(trials=min(max(marks.values()), size))
    ratios: dict[str, list[float]] = {label: [] for label in marks}
    evals: list[int] = []
    missed = proposals = 0
    cpu = 0.0
    warm = sorted(prior, key=prior.__getitem__)[:WARM_FROM_PRIOR] if prior else []
    for seed in range(seeds):
        space = landscape.search_space()
        clock = _CpuUpTo(landscape.evaluator(), CPU_PROPOSALS)
        if settings:  # cold, a variant of the strategy
            search = STRATEGIES[strategy](space, seed=seed, **settings)
        else:
            search = get_strategy(strategy, space, seed=seed, prior=prior,
                                  warm_start=[] if STRATEGIES[strategy].uses_prior else warm)  # fmt: skip
        log = run_search(search, clock.evaluate, budget)
        cpu += clock.cpu_s
        proposals += clock.counted
        for label, n in marks.items():
            best = log.best_after(min(n, size))
            ratios[label].append(0.0 if best is None else optimum / best)
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
        cpu_ms=1e3 * cpu / max(1, proposals),
        errors={
            n: statistics.stdev(r) / math.sqrt(len(r)) if len(r) > 1 else 0.0
            for n, r in ratios.items()
        },
    )


def scrambled(landscape: Landscape, seed: int = 0) -> Landscape:
    """``landscape`` with each parameter's choices relabelled in a seeded random order: the same
    times over the same space, but a parameter's order (small tile to large) says nothing. A
    strategy that holds only where order means "similar" is found out here: spaces it has never
    seen may have parameters whose numbers are names (an unroll factor where 0 means "full")."""
    rng = random.Random(seed)
    relabel: dict[str, dict[Any, Any]] = {}
    for name, choices in landscape.space.items():
        shuffled = list(choices)
        rng.shuffle(shuffled)
        relabel[name] = dict(zip(choices, shuffled, strict=True))
    entries = [e.model_copy(update={"config": {k: relabel[k][v] for k, v in e.config.items()}})
               for e in landscape.entries]  # fmt: skip
    key = {**landscape.key, "kernel": f"{landscape.key.get('kernel', '?')} (scrambled)"}
    return dataclasses.replace(landscape, key=key, entries=entries,
                               note=f"{landscape.note}; choices relabelled (seed {seed})")  # fmt: skip


def landscape_name(path: Path) -> str:
    """A landscape's name: its file's, without ``.json`` or ``.json.gz``."""
    return path.name.removesuffix(".gz").removesuffix(".json")


def load_landscapes(paths: Sequence[Path], *, scramble: bool = False) -> dict[str, Landscape]:
    """The landscapes by name (skipping, with a line on stderr, a file that does not load or
    whose name was loaded from another folder already); with
    ``scramble``, each one again with its choices relabelled (:func:`scrambled`)."""
    landscapes: dict[str, Landscape] = {}
    for path in paths:
        name = landscape_name(path)
        if name in landscapes:
            print(f"skipping {path}: a landscape named {name} is already loaded", file=sys.stderr)
            continue
        try:
            landscape = Landscape.load(path)
            landscape.optimum()
        except InvalidInput as exc:
            print(f"skipping {path}: {exc}", file=sys.stderr)
            continue
        landscapes[name] = landscape
    if scramble:
        landscapes.update({f"{name} (scrambled)": scrambled(landscape)
                           for name, landscape in list(landscapes.items())})  # fmt: skip
    return landscapes


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
        f"({ok} ok), optimum {optimum.time_ms:.4g} ms at `{Config.of(optimum.config)}`"
        + (f"; {landscape.note}" if landscape.note else "")
    )


def table(rows: Sequence[tuple[str, Efficiency]], spread: bool = False) -> list[str]:
    """A markdown table, one row per (landscape, strategy); with ``spread``, each mean with its
    standard error over seeds where it has one (``0.944 ±0.021``)."""
    labels = list(rows[0][1].ratios)

    def cell(eff: Efficiency, label: str) -> str:
        error = eff.errors.get(label) if spread else None
        return f"{eff.ratios[label]:.3f}" + (f" ±{error:.3f}" if error else "")

    header = ["landscape", "strategy", *labels, "evals to 5%", "CPU ms/proposal"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, eff in rows:
        to_target = f"{'>' if eff.missed else ''}{eff.evals_to_target:.0f}"
        if eff.missed:
            to_target += f" ({eff.missed} missed)"
        cells = [name, eff.strategy, *[cell(eff, n) for n in labels], to_target,
                 f"{eff.cpu_ms:.2f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def family_of(landscapes: dict[str, Landscape]) -> dict[str, dict[str, Landscape]]:
    """Each landscape's family: the landscapes of the same kernel over the same parameters."""

    def kind(landscape: Landscape) -> tuple[str, tuple[str, ...]]:
        return str(landscape.key.get("kernel", "")), tuple(sorted(landscape.space))

    return {name: {other: o for other, o in landscapes.items() if kind(o) == kind(landscape)}
            for name, landscape in landscapes.items()}  # fmt: skip


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
                cpu_ms=statistics.fmean(e.cpu_ms for e in effs),
                errors={
                    n: math.sqrt(sum(e.errors.get(n, 0.0) ** 2 for e in effs)) / len(effs)
                    for n in effs[0].ratios
                },  # the landscapes' errors combined as independent
            )
        )
    return out


def family_name(landscape: Landscape) -> str:
    """A family's name: its kernel and backend (the same kernel over the same parameters)."""
    key: dict[str, Any] = landscape.key
    return f"{key.get('kernel', '?')}/{key.get('backend', '?')} ({len(landscape.space)} params)"


def by_family(results: dict[str, list[Efficiency]], landscapes: dict[str, Landscape],
              strategies: Sequence[str]) -> list[tuple[str, Efficiency]]:  # fmt: skip
    """Each family's figures (its landscapes averaged), then per strategy the worst family's
    (each column's minimum; the most evaluations to 5 %) and the families' average: a strategy
    is judged by the family it does worst on, not by the landscapes one family has many of."""
    groups: dict[str, dict[str, list[Efficiency]]] = {}
    for name, per in results.items():
        groups.setdefault(family_name(landscapes[name]), {})[name] = per
    families = {family: average(members, strategies) for family, members in groups.items()}
    rows = [(family, eff) for family, effs in families.items() for eff in effs]
    for i, strategy in enumerate(strategies):
        effs = [effs[i] for effs in families.values()]
        worst = Efficiency(
            strategy=strategy,
            ratios={n: min(e.ratios[n] for e in effs) for n in effs[0].ratios},
            evals_to_target=max(e.evals_to_target for e in effs),
            missed=sum(e.missed for e in effs),
            cpu_ms=max(e.cpu_ms for e in effs),
        )
        rows.append(("*worst family*", worst))
    rows += [("*family average*", eff) for eff in average(families, strategies)]
    return rows


def bar(families: Sequence[tuple[str, Efficiency]], strategies: Sequence[str]) -> list[str]:
    """The default strategy against the better of :data:`BAR_AGAINST` in each family (rows of
    :func:`by_family`) at each fixed count: how many cells fall more than :data:`BAR_SLACK`
    below, and which, with the gap and twice the two standard errors combined (a gap within it
    is noise that more seeds resolve). Empty when the default or all of them were not run."""
    against = [s for s in BAR_AGAINST if s in strategies]
    if DEFAULT_STRATEGY not in strategies or not against:
        return []
    by: dict[str, dict[str, Efficiency]] = {}
    for family, eff in families:
        if not family.startswith("*"):
            by.setdefault(family, {})[eff.strategy] = eff
    labels = [f"@{n}" for n in CHECKPOINTS]
    below: list[str] = []
    beyond = 0
    for family, effs in by.items():
        ours = effs[DEFAULT_STRATEGY]
        for label in labels:
            other = max((effs[s] for s in against), key=lambda e: e.ratios[label])
            gap = ours.ratios[label] - other.ratios[label]
            if gap >= -BAR_SLACK:
                continue
            noise = 2 * math.hypot(ours.errors.get(label, 0.0), other.errors.get(label, 0.0))
            beyond += -gap - BAR_SLACK > noise
            below.append(f"| {family} | {label} | {ours.ratios[label]:.3f} | {other.strategy} "
                         f"{other.ratios[label]:.3f} | {gap:+.3f} | {noise:.3f} |")  # fmt: skip
    cells = len(by) * len(labels)
    whom = f"the better of {' and '.join(against)}" if len(against) > 1 else against[0]
    head = (
        f"`{DEFAULT_STRATEGY}` below {whom} less "
        f"{BAR_SLACK}: {len(below)} of {cells} cells (families × fixed counts); {beyond} "
        f"of them by more than the slack plus twice their standard errors combined."
    )
    if not below:
        return [head]
    return [head, "", "| family | at | default | better | gap | 2 SE |", "|---|---|---|---|---|---|",
            *below]  # fmt: skip


def render(landscapes: dict[str, Landscape], results: dict[str, list[Efficiency]],
           transferred: dict[str, list[Efficiency]], strategies: Sequence[str], seeds: int,
           seconds: float) -> str:  # fmt: skip
    """The markdown report: the landscapes, then the cold tables (by landscape, by family) and
    the transfer table when there is one."""
    rows = [(name, eff) for name, per in results.items() for eff in per]
    rows += [("*average*", eff) for eff in average(results, strategies)]
    families = by_family(results, landscapes, strategies)
    moved = [(name, eff) for name, per in transferred.items() for eff in per]
    moved_families: list[tuple[str, Efficiency]] = []
    if moved:
        moved += [("*average*", eff) for eff in average(transferred, strategies)]
        moved_families = by_family(transferred, landscapes, strategies)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join([
        "# Search efficiency: optimum / best found after n evaluations (1.0 is perfect)",
        "",
        f"- {seeds} seeds per strategy; counts beyond a landscape's size are capped at it;",
        f"  'evals to 5%': mean evaluations to within {WITHIN:.0%} of the optimum, '>' when some",
        "  seeds missed within the largest budget (a miss counts as the whole budget);",
        "  n% columns: after that share of the landscape's valid (recorded) configs",
        f"- run: {stamp}, {seconds:.0f} s in all, on {machine()}",
        "",
        "Landscapes:",
        "",
        *[describe(name, landscape) for name, landscape in landscapes.items()],
        "",
        "## Cold: no prior knowledge",
        "",
        *table(rows),
        "",
        "## Cold, by family: the worst family and the families' average",
        "",
        "Each family's mean with its standard error over seeds (± one; its landscapes taken as",
        "independent). A difference smaller than about twice the two errors combined is noise:",
        "more seeds (``--seeds``, for some landscapes ``--only``) resolve it.",
        "",
        *table(families, spread=True),
        "",
        *bar(families, strategies),
        "",
        *(["## With transfer: the family's other devices as prior knowledge",
           "", *table(moved), "", "### With transfer, by family", "",
           *table(moved_families, spread=True), "", *bar(moved_families, strategies), ""]
          if moved else []),
    ])  # fmt: skip
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "folders",
        nargs="*",
        type=Path,
        default=[LANDSCAPES],
        help="folders of landscapes (default: bench/landscapes)",
    )
    parser.add_argument("--seeds", type=int, default=10, help="replays per strategy (seeds 0..)")
    parser.add_argument("--strategies", default=f"exhaustive,random,{DEFAULT_STRATEGY}")
    parser.add_argument("--transfer", action="store_true",
                        help="also search each landscape with its family's others as a prior")  # fmt: skip
    parser.add_argument("--scrambled", action="store_true",
                        help="also replay each landscape with its choices relabelled "
                             "(a family of its own: order says nothing)")  # fmt: skip
    parser.add_argument("--fractions", default=",".join(str(f) for f in FRACTIONS),
                        help="shares of each landscape's configs to report after (and search "
                             "up to, beyond the fixed counts)")  # fmt: skip
    parser.add_argument("--only", default="",
                        help="NAME,...: replay only these landscapes (file names without .json; "
                             "with --scrambled, their relabelled twins too)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the markdown")
    args = parser.parse_args(argv)
    strategies = [s for s in args.strategies.split(",") if s]
    try:
        fractions = [float(f) for f in args.fractions.split(",") if f]
    except ValueError:
        parser.error(f"--fractions: numbers between 0 and 1, got {args.fractions!r}")
    if not all(0 < f <= 1 for f in fractions):
        parser.error(f"--fractions: numbers between 0 and 1, got {args.fractions!r}")
    if args.seeds < 1:
        parser.error(f"--seeds: at least 1, got {args.seeds}")
    if unknown := [s for s in strategies if s not in STRATEGIES]:
        parser.error(f"unknown strategies {unknown}; known: {', '.join(sorted(STRATEGIES))}")
    paths = [path for folder in args.folders
             for path in sorted([*folder.glob("*.json"), *folder.glob("*.json.gz")])]  # fmt: skip
    if only := {name for name in args.only.split(",") if name}:
        named = {landscape_name(path) for path in paths}
        if unknown := sorted(only - named):
            parser.error(f"--only: no landscape {', '.join(unknown)} in the folders")
        paths = [path for path in paths if landscape_name(path) in only]
    if not paths:
        print(f"no *.json landscapes in {', '.join(map(str, args.folders))}", file=sys.stderr)
        return 2

    started = time.perf_counter()
    landscapes = load_landscapes(paths, scramble=args.scrambled)
    results: dict[str, list[Efficiency]] = {}
    transferred: dict[str, list[Efficiency]] = {}
    families = family_of(landscapes)
    for name, landscape in landscapes.items():
        results[name] = [measure(landscape, s, args.seeds, fractions=fractions)
                         for s in strategies]  # fmt: skip
        if args.transfer and len(families[name]) > 1:
            prior = prior_for(name, families[name])
            transferred[name] = [measure(landscape, s, args.seeds, prior, fractions)
                                 for s in strategies]  # fmt: skip
        print(f"{name}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    if not results:
        return 2

    text = render(landscapes, results, transferred, strategies, args.seeds,
                  time.perf_counter() - started)  # fmt: skip
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
