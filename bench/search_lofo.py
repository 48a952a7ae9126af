"""Leave one family out: are the default search's settings chosen on the families they are judged on?

The default strategy has settings (how many random configs before the models, when the local
search joins). Chosen by looking at every landscape we have, they could fit this table and no
other. So, per family of landscapes (one kernel over the same parameters, on several devices or
shapes) held out in turn with its kin (the families over the same parameters: its relabelled
twin, a fused variant of the same kernel, kernels sharing one schedule space), each setting of a
grid is replayed on every landscape (cold, 10 seeds by default, as :mod:`bench.search_efficiency`
replays them), the setting whose worst family *among the rest* is best at ``--at`` evaluations
(their average breaks ties) is chosen, and the held-out family is scored with it. The table
shows, per held-out family, the chosen setting and the family's means at each checkpoint beside
the shipped default's; then each one's worst family and the families' average. A default that
holds on families it never saw scores about as well here as on the table it was chosen from.

    python -m bench.search_lofo [FOLDER ...] [--grid "local_after=0,25,100"]
        [--seeds 10] [--at @100] [--scrambled] [--out bench/results/search_lofo.md]

Figures, never pass/fail.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import itertools
import statistics
import sys
import time
from collections.abc import Mapping, Sequence, Set
from pathlib import Path
from typing import Any

from bench.report import machine
from bench.search_efficiency import (
    FRACTIONS,
    LANDSCAPES,
    Efficiency,
    checkpoints_of,
    family_name,
    load_landscapes,
    measure,
)
from tuner.landscape import Landscape
from tuner.search import DEFAULT_STRATEGY, STRATEGIES

RESULTS = Path(__file__).with_name("results") / "search_lofo.md"
GRID = "local_after=0,25,100"

Setting = tuple[tuple[str, int], ...]  # a setting: (name, value) pairs, hashable


def parse_grid(text: str) -> list[Setting]:
    """``"a=1,2;b=3"`` -> every combination, as settings.

    Example:
        >>> parse_grid("local_after=0,25;initial=10")
        [(('local_after', 0), ('initial', 10)), (('local_after', 25), ('initial', 10))]
    """
    axes = []
    for part in filter(None, text.split(";")):
        name, _, values = part.partition("=")
        if not name.strip().isidentifier() or not values:
            raise ValueError(f"--grid: NAME=V1,V2;... got {part!r}")
        try:
            axes.append([(name.strip(), int(v)) for v in values.split(",")])
        except ValueError:
            raise ValueError(
                f"--grid: whole numbers after {name.strip()}=, got {values!r}"
            ) from None
    return [tuple(combo) for combo in itertools.product(*axes)]


def label(setting: Setting) -> str:
    return " ".join(f"{name}={value}" for name, value in setting) or "(default)"


def family_means(per_landscape: Mapping[str, Efficiency],
                 landscapes: Mapping[str, Landscape]) -> dict[str, dict[str, float]]:  # fmt: skip
    """Each family's mean at each checkpoint (its landscapes averaged)."""
    groups: dict[str, list[Efficiency]] = {}
    for name, eff in per_landscape.items():
        groups.setdefault(family_name(landscapes[name]), []).append(eff)
    return {family: {mark: statistics.fmean(e.ratios[mark] for e in effs) for mark in effs[0].ratios}
            for family, effs in groups.items()}  # fmt: skip


def kin_of(landscapes: Mapping[str, Landscape]) -> dict[str, str]:
    """Each family's kin: the families over the same parameters (a kernel's relabelled twin, a
    matmul and its fused-epilogue variant, norms sharing one schedule space). A family is held
    out with its kin, so no near-copy of it helps choose its setting."""
    return {family_name(landscape): f"{landscape.key.get('backend', '?')} over "
            + ",".join(sorted(landscape.space)) for landscape in landscapes.values()}  # fmt: skip


def choose(means: Mapping[Setting, dict[str, dict[str, float]]], held_out: Set[str],
           at: str) -> Setting:  # fmt: skip
    """The setting whose worst family outside ``held_out`` is best at ``at`` (then the others'
    average)."""

    def score(setting: Setting) -> tuple[float, float]:
        others = [m[at] for family, m in means[setting].items() if family not in held_out]
        return (min(others), statistics.fmean(others)) if others else (0.0, 0.0)

    return max(means, key=score)


def summary(rows: Sequence[dict[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """The worst family (each column's minimum) and the families' average."""
    marks = list(rows[0])
    return ({m: min(r[m] for r in rows) for m in marks},
            {m: statistics.fmean(r[m] for r in rows) for m in marks})  # fmt: skip


def report(means: Mapping[Setting, dict[str, dict[str, float]]], default: Setting, at: str,
           kin: Mapping[str, str], header: Sequence[str]) -> list[str]:  # fmt: skip
    families = sorted(means[default])
    marks = list(means[default][families[0]])
    lines = [*header, "", "| held-out family | setting | " + " | ".join(marks) + " |",
             "|" + "---|" * (len(marks) + 2)]  # fmt: skip
    chosen_rows: list[dict[str, float]] = []
    default_rows: list[dict[str, float]] = []
    candidates = {setting: m for setting, m in means.items() if setting != default}
    for family in families:
        chosen = choose(candidates, {f for f in families if kin[f] == kin[family]}, at)
        for name, setting in (("chosen: " + label(chosen), chosen), ("default", default)):
            row = means[setting][family]
            (chosen_rows if name != "default" else default_rows).append(row)
            lines.append(f"| {family} | {name} | " + " | ".join(f"{row[m]:.3f}" for m in marks)
                         + " |")  # fmt: skip
    for name, rows in (("left out, chosen", chosen_rows), ("default", default_rows)):
        worst, mean = summary(rows)
        lines.append(f"| *worst family* | {name} | " + " | ".join(f"{worst[m]:.3f}" for m in marks)
                     + " |")  # fmt: skip
        lines.append(f"| *family average* | {name} | "
                     + " | ".join(f"{mean[m]:.3f}" for m in marks) + " |")  # fmt: skip
    return lines


def settings_of(strategy: str) -> dict[str, inspect.Parameter]:
    """The whole-number settings of ``strategy``'s class (keyword-only, an int or None default)."""
    parameters = inspect.signature(STRATEGIES[strategy]).parameters.items()
    return {name: param for name, param in parameters
            if param.kind is param.KEYWORD_ONLY and name not in ("seed", "prior")
            and (param.default is None or type(param.default) is int)}  # fmt: skip


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[Setting]]:
    """The arguments and the grid, every one checked before anything is replayed."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.search_lofo", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("folders", nargs="*", type=Path, default=[LANDSCAPES])
    parser.add_argument("--grid", default=GRID, help="NAME=V1,V2;... settings of the default")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--at", default="@100", help="the checkpoint settings are chosen by")
    parser.add_argument("--scrambled", action="store_true", help="relabelled families too")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    try:
        grid = parse_grid(args.grid)
    except ValueError as exc:
        parser.error(str(exc))
    if not grid or grid == [()]:
        parser.error(f"--grid: at least one NAME=V1,V2, got {args.grid!r}")
    known = settings_of(DEFAULT_STRATEGY)
    if unknown := sorted({name for setting in grid for name, _ in setting} - set(known)):
        parser.error(f"--grid: {DEFAULT_STRATEGY} has no whole-number setting "
                     f"{', '.join(unknown)} (it has {', '.join(known)})")  # fmt: skip
    if args.seeds < 1:
        parser.error(f"--seeds: at least 1, got {args.seeds}")
    if args.at not in (marks := checkpoints_of(1, FRACTIONS[1:2])):
        parser.error(f"--at: one of {', '.join(marks)}, got {args.at!r}")
    return args, grid


def replay(landscapes: Mapping[str, Landscape], grid: Sequence[Setting],
           seeds: int) -> dict[Setting, dict[str, dict[str, float]]]:  # fmt: skip
    """Each family's means under the default (``()``) and under each setting of ``grid``."""
    started = time.perf_counter()
    known = settings_of(DEFAULT_STRATEGY)
    means: dict[Setting, dict[str, dict[str, float]]] = {}
    for setting in [(), *grid]:
        if setting and all(known[name].default == value for name, value in setting):
            means[setting] = means[()]  # the default's own values: replayed once
            continue
        settings: dict[str, Any] = dict(setting)
        effs = {name: measure(landscape, DEFAULT_STRATEGY, seeds, fractions=FRACTIONS[1:2],
                              settings=settings or None)
                for name, landscape in landscapes.items()}  # fmt: skip
        means[setting] = family_means(effs, landscapes)
        print(f"{label(setting)}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return means


def main(argv: list[str] | None = None) -> int:
    args, grid = parse_args(argv)
    paths = [p for folder in args.folders
             for p in sorted([*folder.glob("*.json"), *folder.glob("*.json.gz")])]  # fmt: skip
    landscapes = load_landscapes(paths, scramble=args.scrambled)
    kin = kin_of(landscapes)
    if len(set(kin.values())) < 2:
        print(f"leaving one family out needs families over at least two sets of parameters; "
              f"{', '.join(map(str, args.folders))} has {len(set(kin.values()))}",
              file=sys.stderr)  # fmt: skip
        return 2
    started = time.perf_counter()
    means = replay(landscapes, grid, args.seeds)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    header = [
        f"# Leave one family out: `{DEFAULT_STRATEGY}`'s settings chosen without the family "
        "they are scored on",
        "",
        f"- grid: `{args.grid}`; for each family, the setting whose worst family is best at "
        f"{args.at} (then their average) among the families over other parameters (its own, "
        "its relabelled twin and its kin over the same parameters left out); "
        f"{args.seeds} seeds, cold; {len(landscapes)} landscapes",
        f"- run: {stamp}, {time.perf_counter() - started:.0f} s in all, on {machine()}",
    ]
    text = "\n".join(report(means, (), args.at, kin, header)) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
