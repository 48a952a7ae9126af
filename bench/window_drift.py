"""How far one comparison moves between quiet windows: the ceiling of any interval timed in one.

An interleaved comparison's interval (:mod:`tunecache.interleave`) holds what its window's rounds
vary by. This bench asks what it cannot see: the same comparison, on a quiet machine, timed again
in another window of the same process (after an idle ``--gap``) and in another process. For each
key, ``--processes`` fresh measurement workers each time the kernel's default config against
torch eager in ``--windows`` windows of ``--rounds`` alternating rounds; it reports each window's
ratio (default / eager), their spread, and how often one window's interval holds another
window's ratio (ordered pairs; within a process and across processes). An interval built in one
window can hold a later window's ratio no more often than this, whatever it is built from.

Writes ``bench/results/window_drift-<cpu>.md``. Figures, never pass/fail.

    python -m bench.window_drift [--keys bias_gelu/tvm,softmax/inductor] [--windows 4]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.report import write_result
from tunecache.interleave import Ratio, ratio, rounds
from tunecache.key import key_for
from tunecache_cli.table import render
from tuner.harness import Harness
from tuner.harness.task import Task
from tuner.tune import default_config
from workloads import get_workload

WORKLOADS = ("matmul", "softmax", "layernorm", "rmsnorm", "bias_gelu")
BACKENDS = ("tvm", "inductor")


@dataclass(frozen=True)
class Window:
    process: int
    ratio: Ratio  # the default config's time over torch eager's


def holds(windows: Sequence[Window]) -> tuple[tuple[int, int], tuple[int, int]]:
    """Ordered pairs of different windows where the first's interval holds the second's median:
    ``((held, pairs) within a process, (held, pairs) across processes)``.

    Example:
        >>> a, b = Ratio(1.0, 0.9, 1.1, 5), Ratio(1.5, 1.4, 1.6, 5)
        >>> holds([Window(0, a), Window(0, a), Window(1, b)])
        ((2, 2), (0, 4))
    """
    counts = {True: [0, 0], False: [0, 0]}
    for first, second in itertools.permutations(windows, 2):
        count = counts[first.process == second.process]
        count[0] += first.ratio.low <= second.ratio.median <= first.ratio.high
        count[1] += 1
    return (counts[True][0], counts[True][1]), (counts[False][0], counts[False][1])


def measure(name: str, backend: str, processes: int, windows: int, count: int,
            gap: float) -> list[Window]:  # fmt: skip
    """``windows`` windows of ``count`` rounds (eager, the default) in each of ``processes``
    fresh workers, ``gap`` idle seconds before each window after the first."""
    workload = get_workload(name)
    key = key_for(name, backend, workload.demo_problem, "float32")
    task = Task(backend=backend, workload=name, problem=dict(key.problem), dtype=key.dtype,
                device=key.device.kind)  # fmt: skip
    contenders = [None, default_config(workload, key)]
    found = []
    for process in range(processes):
        with Harness(workers=1) as harness:
            bench = harness.benchmarker(task)

            def time_one(i: int, bench: Any = bench) -> float:
                return bench.measure(contenders[i]).time_ms or 0.0

            for window in range(windows):
                if window:
                    time.sleep(gap)
                found.append(Window(process, ratio(rounds(time_one, 2, count), 1, 0)))
    return found


def _row(key: str, windows: Sequence[Window]) -> list[str]:
    medians = [w.ratio.median for w in windows]
    (within, pairs), (across, other) = holds(windows)
    return [key, " ".join(f"{m:.3f}" for m in medians), f"{max(medians) / min(medians):.3f}",
            f"{within}/{pairs}", f"{across}/{other}"]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", help="workload/backend,... (default: every workload, both)")
    parser.add_argument("--processes", type=int, default=3, help="fresh workers per key")
    parser.add_argument("--windows", type=int, default=4, help="windows per worker")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per window")
    parser.add_argument("--gap", type=float, default=2.0, help="idle seconds between windows")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    keys = ([tuple(k.split("/")) for k in args.keys.split(",")] if args.keys
            else [(w, b) for w in WORKLOADS for b in BACKENDS])  # fmt: skip
    started = time.perf_counter()
    rows, totals = [], [0, 0, 0, 0]
    for name, backend in keys:
        windows = measure(name, backend, args.processes, args.windows, args.rounds, args.gap)
        rows.append(_row(f"{name}/{backend}", windows))
        (within, pairs), (across, other) = holds(windows)
        for i, value in enumerate((within, pairs, across, other)):
            totals[i] += value
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    header = ["key", "default/eager in each window", "max/min", "held in the process",
              "held across processes"]  # fmt: skip
    table = render(header, rows)
    spread = statistics.median(float(r[2]) for r in rows)
    summary = [
        f"a window's interval held another window's ratio: {totals[0]} of {totals[1]} pairs in "
        f"one process, {totals[2]} of {totals[3]} across processes",
        f"median spread of a key's window ratios (max/min): {spread:.3f}",
    ]
    print(table)
    print("\n".join(summary))
    notes = [
        f"{len(keys)} keys at each workload's demo shape, float32: the default config against "
        f"torch eager (its own thread count), {args.rounds} alternating rounds a window, "
        f"{args.windows} windows {args.gap:g} s apart in each of {args.processes} fresh "
        "measurement workers, on a quiet machine",
        "a window's interval: the tuner's own (tunecache.interleave.ratio: the median's "
        "distribution-free 95 % interval, at least 1 % either side)",
        *summary,
        f"{time.perf_counter() - started:.0f} s in all",
    ]
    if not args.no_write:
        write_result("window_drift", "One comparison in quiet windows: how far it moves", notes,
                     table)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
