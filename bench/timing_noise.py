"""Whether tuning on a busy machine picks the winner a quiet one does, and says how sure it is.

Tunes every key (TVM and Inductor, CPU) three times: on a quiet machine, quietly again (the
control: two quiet searches differ too), then with ``--load`` busy processes the bench starts and
stops itself. Then, quietly, times each key's three winners, torch eager and the default config
in alternating rounds (:mod:`tunecache.interleave`) and reports:

* whether the loaded machine's winner is within 5 % of the quiet one's (``loaded/quiet``), and
  how often the second quiet tune's is (the control);
* whether each reported speedup's interval (vs eager, vs the default config) holds the ratio of
  the same comparison (its winner, eager, the default) re-run quietly, and the ratio in the
  five-way rounds (what else runs in a round moves eager's time: both are shown);
* every reported ratio above 50x, and whether it held quietly;
* which records the tuner flagged noisy, and why.

Writes ``bench/results/timing_noise-<cpu>.md``. Figures, never pass/fail.

    python -m bench.timing_noise [--trials 32] [--load 2] [--keys matmul/tvm,softmax/inductor]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from backends import Budget
from bench.report import write_result
from tunecache.interleave import ROUNDS, median_ratio, ratio, rounds
from tunecache.key import key_for
from tunecache.schemas import RecordCreate
from tunecache_cli.table import render
from tuner import TuneOptions, tune
from tuner.harness import Harness
from tuner.harness.task import Task
from tuner.tune import default_config
from workloads import get_workload

WORKLOADS = ("matmul", "softmax", "layernorm", "rmsnorm", "bias_gelu")
BACKENDS = ("tvm", "inductor")
WITHIN = 1.05  # the loaded winner within 5 % of the quiet winner
HIGH_RATIO = 50.0


def _spin() -> None:
    while True:
        pass


@contextmanager
def busy(count: int) -> Iterator[None]:
    """``count`` processes that keep a core busy each, for the duration of the block."""
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_spin, daemon=True) for _ in range(count)]
    for p in procs:
        p.start()
    time.sleep(0.5)
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.join()


def _tune_all(keys: Sequence[tuple[str, str]], trials: int, harness: Harness,
              workdir: Path) -> dict[tuple[str, str], RecordCreate]:  # fmt: skip
    records = {}
    for name, backend in keys:
        key = key_for(name, backend, get_workload(name).demo_problem, "float32")
        started = time.perf_counter()
        outcome = tune(key, Budget(trials=trials), TuneOptions(workdir=workdir), harness=harness)
        records[(name, backend)] = outcome.record
        print(f"  {name}/{backend}: {outcome.record.timing.median_ms:.4g} ms "
              f"({outcome.record.config_summary}) in {time.perf_counter() - started:.0f} s"
              f"{' NOISY' if outcome.record.noisy else ''}", file=sys.stderr, flush=True)  # fmt: skip
    return records


def _retime(records: Sequence[RecordCreate], harness: Harness, count: int) -> list[list[float]]:
    """Alternating rounds of: each record's winner (in order), torch eager, the default."""
    key = records[0].key.to_key()
    task = Task(backend=key.backend, workload=key.kernel, problem=dict(key.problem),
                dtype=key.dtype, device=key.device.kind)  # fmt: skip
    bench = harness.benchmarker(task)
    default = default_config(get_workload(key.kernel), key)
    contenders: list[Any] = [*(r.config for r in records), None]
    if default is not None:
        contenders.append(default)

    def time_one(i: int) -> float:
        measured = bench.measure(contenders[i])
        return measured.time_ms or 0.0

    return rounds(time_one, len(contenders), count)


def _intervals(label: str, record: RecordCreate, times: list[list[float]], winner: int,
               misses: list[str], eager: int = 3) -> list[str]:  # fmt: skip
    """For the eager and default baselines (columns ``eager`` and the next of ``times``):
    whether ``record``'s interval holds the quietly re-measured ratio (``yes``/``no``; ``-``: no
    interval or no such baseline); each miss, with its numbers, goes to ``misses``."""
    found = []
    for baseline, column in (("torch_eager", eager), ("default_config", eager + 1)):
        interval = record.speedup_interval(baseline)
        if interval is None or column >= len(times[0]):
            found.append("-")
            continue
        again = median_ratio(times, column, winner)
        holds = interval[0] <= again <= interval[1]
        found.append("yes" if holds else "no")
        if not holds:
            off = again / interval[1] - 1 if again > interval[1] else again / interval[0] - 1
            misses.append(f"{label} vs {baseline}: reported {record.speedup(baseline):.3f} "
                          f"({interval[0]:.3f}-{interval[1]:.3f}), re-measured {again:.3f} "
                          f"({off:+.1%} outside)")  # fmt: skip
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=32, help="search budget per key")
    parser.add_argument("--load", type=int, default=2, help="busy processes while loaded")
    parser.add_argument("--rounds", type=int, default=2 * ROUNDS, help="re-timing rounds")
    parser.add_argument("--keys", help="workload/backend,... (default: every workload, both)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    keys = ([tuple(k.split("/")) for k in args.keys.split(",")] if args.keys
            else [(w, b) for w in WORKLOADS for b in BACKENDS])  # fmt: skip
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="timing-noise-") as tmp, Harness() as harness:
        print("quiet:", file=sys.stderr)
        quiet = _tune_all(keys, args.trials, harness, Path(tmp) / "quiet")
        print("quiet again (the control: how far two quiet tunes differ):", file=sys.stderr)
        again = _tune_all(keys, args.trials, harness, Path(tmp) / "again")
        print(f"loaded ({args.load} busy processes):", file=sys.stderr)
        with busy(args.load):
            loaded = _tune_all(keys, args.trials, harness, Path(tmp) / "loaded")
        print("re-timing quietly", file=sys.stderr)
        retimed = {k: _retime([quiet[k], again[k], loaded[k]], harness, args.rounds)
                   for k in keys}  # fmt: skip
        # Each record's own comparison again (its winner, eager, the default), as it was timed.
        own = {(k, label): _retime([runs[k]], harness, args.rounds)
               for k in keys for label, runs in (("quiet", quiet), ("loaded", loaded))}  # fmt: skip
    rows: list[list[str]] = []
    misses: list[str] = []
    five_way_misses: list[str] = []
    high: list[str] = []
    why: list[str] = []
    within = {"control": 0, "loaded": 0}
    held = {"quiet": [0, 0], "loaded": [0, 0]}  # intervals that hold, intervals
    five_way = {"quiet": [0, 0], "loaded": [0, 0]}  # the same, in the five-way rounds
    keys_held = 0
    for k in keys:
        times, name = retimed[k], f"{k[0]}/{k[1]}"
        control, versus = ratio(times, 1, 0), ratio(times, 2, 0)
        within["control"] += control.median <= WITHIN
        within["loaded"] += versus.median <= WITHIN
        checks = {}
        for label, record, winner in (("quiet", quiet[k], 0), ("loaded", loaded[k], 2)):
            checks[label] = _intervals(f"{name} {label}", record, own[(k, label)], 0, misses,
                                       eager=1)  # fmt: skip
            held[label][0] += checks[label].count("yes")
            held[label][1] += sum(c != "-" for c in checks[label])
            amid = _intervals(f"{name} {label}", record, times, winner, five_way_misses)
            five_way[label][0] += amid.count("yes")
            five_way[label][1] += sum(c != "-" for c in amid)
            for baseline in ("torch_eager", "default_config"):
                value = record.speedup(baseline)
                if value is not None and value > HIGH_RATIO:
                    column = 3 if baseline == "torch_eager" else 4
                    measured = median_ratio(times, column, winner) \
                        if column < len(times[0]) else None  # fmt: skip
                    high.append(
                        f"{name} {label} vs {baseline}: {value:.1f}x, quietly "
                        f"re-measured {measured if measured is None else f'{measured:.1f}x'}"
                    )
            if record.noisy:
                why.append(f"{name} {label}: " + "; ".join(record.noise()))
        keys_held += "no" not in checks["loaded"]
        noisy = [r for r, flagged in (("quiet", quiet[k].noisy), ("loaded", loaded[k].noisy))
                 if flagged]  # fmt: skip
        rows.append([name, quiet[k].config_summary[:28], loaded[k].config_summary[:28],
                     f"{control.median:.3f} ({control.low:.3f}-{control.high:.3f})",
                     f"{versus.median:.3f} ({versus.low:.3f}-{versus.high:.3f})",
                     "yes" if versus.median <= WITHIN else "NO",
                     " ".join(checks["quiet"]), " ".join(checks["loaded"]),
                     ",".join(noisy) or "-"])  # fmt: skip
    header = ["key", "quiet winner", "loaded winner", "quiet again/quiet", "loaded/quiet",
              "within 5 %", "quiet holds (eager default)", "loaded holds (eager default)",
              "flagged noisy"]  # fmt: skip
    table = render(header, rows)
    summary = [
        f"loaded winners within 5 % of the quiet winner: {within['loaded']} of {len(keys)} "
        f"(the control, a second quiet tune: {within['control']} of {len(keys)})",
        f"reported speedup intervals that hold the ratio of the same comparison (winner, eager, "
        f"default) re-run quietly: loaded records {held['loaded'][0]} of {held['loaded'][1]} "
        f"(keys whose every interval holds: {keys_held} of {len(keys)}); quiet records "
        f"{held['quiet'][0]} of {held['quiet'][1]}",
        f"the same intervals against the five-way rounds (three winners, eager, default): loaded "
        f"{five_way['loaded'][0]} of {five_way['loaded'][1]}, quiet {five_way['quiet'][0]} of "
        f"{five_way['quiet'][1]}",
        "ratios above 50x: " + ("; ".join(high) if high else "none"),
        "intervals that missed: " + ("; ".join(misses) if misses else "none"),
        "missed in the five-way rounds: " + ("; ".join(five_way_misses) or "none"),
        "flagged noisy: " + (" | ".join(why) if why else "none"),
    ]
    print(table)
    print("\n".join(summary))
    notes = [
        f"{len(keys)} keys at each workload's demo shape, float32, {args.trials} trials each "
        f"(each backend's default strategy), tuned three times in one harness: quiet, quiet "
        f"again (the control), and beside {args.load} busy processes (a spin loop each) the "
        "bench starts and stops",
        f"re-timed quietly: {args.rounds} alternating rounds of the three winners, torch eager "
        "and the default config (the five-way rounds); X/quiet is the median of per-round "
        "ratios with its distribution-free 95 % interval; then each record's own comparison "
        f"(its winner, torch eager, the default) again, {args.rounds} rounds",
        *summary,
        f"{time.perf_counter() - started:.0f} s in all",
    ]
    if not args.no_write:
        write_result("timing_noise", "Timings on a busy machine: winners and intervals, "
                     "re-timed quietly", notes, table)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
