"""Whether tuning on a busy machine picks the winner a quiet one does, and says how sure it is.

Tunes every key (TVM and Inductor, CPU) twice: on a quiet machine, then with ``--load`` busy
processes the bench starts and stops itself. Then, quietly, times each key's two winners, torch
eager and the default config in alternating rounds (:mod:`tunecache.interleave`) and reports:

* whether the loaded machine's winner is within 5 % of the quiet one's (``loaded/quiet``);
* whether each reported speedup's interval (vs eager, vs the default config) holds the quiet
  re-measured ratio;
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
from tunecache.cli.table import render
from tunecache.interleave import ROUNDS, ratio, rounds
from tunecache.key import key_for
from tunecache.schemas import RecordCreate
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


def _retime(record: RecordCreate, other: RecordCreate, harness: Harness,
            count: int) -> list[list[float]]:  # fmt: skip
    """Alternating rounds of: the quiet winner, the loaded winner, torch eager, the default."""
    key = record.key.to_key()
    workload = get_workload(key.kernel)
    task = Task(backend=key.backend, workload=key.kernel, problem=dict(key.problem),
                dtype=key.dtype, device=key.device.kind)  # fmt: skip
    bench = harness.benchmarker(task)
    default = default_config(workload, key)
    contenders: list[Any] = [record.config, other.config, None, default]

    def time_one(i: int) -> float:
        measured = bench.measure(contenders[i])
        return measured.time_ms or 0.0

    return rounds(time_one, len(contenders) if default is not None else 3, count)


def _holds(record: RecordCreate, baseline: str, quiet_ratio: float | None) -> str:
    """Whether ``record``'s interval for ``baseline`` holds ``quiet_ratio``: ``yes``, ``no``,
    or ``-`` (no interval, or nothing re-measured)."""
    interval = record.speedup_interval(baseline)
    if interval is None or quiet_ratio is None:
        return "-"
    return "yes" if interval[0] <= quiet_ratio <= interval[1] else "no"


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
        quiet_records = _tune_all(keys, args.trials, harness, Path(tmp) / "quiet")
        print(f"loaded ({args.load} busy processes):", file=sys.stderr)
        with busy(args.load):
            loaded_records = _tune_all(keys, args.trials, harness, Path(tmp) / "loaded")
        print("re-timing quietly", file=sys.stderr)
        retimed = {k: _retime(quiet_records[k], loaded_records[k], harness, args.rounds)
                   for k in keys}  # fmt: skip
    rows, within, holds, intervals, high, why = [], 0, 0, 0, [], []
    for k in keys:
        times, q, lo = retimed[k], quiet_records[k], loaded_records[k]
        versus_quiet = ratio(times, 1, 0)  # loaded winner's time over the quiet winner's
        is_within = versus_quiet.median <= WITHIN
        within += is_within
        quiet_eager = ratio(times, 2, 0).median
        loaded_eager = ratio(times, 2, 1).median
        has_default = len(times[0]) > 3
        quiet_default = ratio(times, 3, 0).median if has_default else None
        loaded_default = ratio(times, 3, 1).median if has_default else None
        checks = [_holds(q, "torch_eager", quiet_eager), _holds(q, "default_config", quiet_default),
                  _holds(lo, "torch_eager", loaded_eager),
                  _holds(lo, "default_config", loaded_default)]  # fmt: skip
        holds += checks.count("yes")
        intervals += sum(c != "-" for c in checks)
        for record, label, measured in ((q, "quiet", (quiet_eager, quiet_default)),
                                        (lo, "loaded", (loaded_eager, loaded_default))):  # fmt: skip
            for baseline, again in zip(("torch_eager", "default_config"), measured, strict=True):
                value = record.speedup(baseline)
                if value is not None and value > HIGH_RATIO:
                    high.append(
                        f"{k[0]}/{k[1]} {label} vs {baseline}: {value:.1f}x, quietly "
                        f"re-measured {again if again is None else f'{again:.1f}x'}"
                    )
        noisy = [r for r, flagged in (("quiet", q.noisy), ("loaded", lo.noisy)) if flagged]
        for label, record in (("quiet", q), ("loaded", lo)):
            if record.noisy:
                why.append(f"{k[0]}/{k[1]} {label}: " + "; ".join(record.noise()))
        rows.append([f"{k[0]}/{k[1]}", q.config_summary[:28], lo.config_summary[:28],
                     f"{versus_quiet.median:.3f} ({versus_quiet.low:.3f}-{versus_quiet.high:.3f})",
                     "yes" if is_within else "NO", " ".join(checks), ",".join(noisy) or "-"])  # fmt: skip
    header = ["key", "quiet winner", "loaded winner", "loaded/quiet (95 %)", "within 5 %",
              "intervals hold (q-eager q-default l-eager l-default)", "flagged noisy"]  # fmt: skip
    table = render(header, rows)
    summary = [
        f"loaded winners within 5 % of the quiet winner: {within} of {len(keys)}",
        f"reported speedup intervals that hold the quiet re-measured ratio: {holds} of {intervals}",
        "ratios above 50x: " + ("; ".join(high) if high else "none"),
        "flagged noisy: " + (" | ".join(why) if why else "none"),
    ]
    print(table)
    print("\n".join(summary))
    notes = [
        f"{len(keys)} keys at each workload's demo shape, float32, {args.trials} trials each "
        f"(each backend's default strategy); loaded: {args.load} busy processes (a spin loop "
        "each) started and stopped by the bench",
        f"re-timed quietly in one harness: {args.rounds} alternating rounds of the quiet winner, "
        "the loaded winner, torch eager and the default config; loaded/quiet is the median of "
        "per-round ratios with its bootstrap 95 % interval",
        *summary,
        f"{time.perf_counter() - started:.0f} s in all",
    ]
    if not args.no_write:
        write_result("timing_noise", "Timings on a busy machine: winners and intervals, "
                     "re-timed quietly", notes, table)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
