"""Two tunes at once on one machine: with turns at timing, are their times a quiet machine's?

Tunes one key (TVM matmul with the ``random`` strategy and a fixed seed, so that every tune
measures the same configs) alone, then two at once taking turns to time (one lock folder:
:mod:`tunecache.devicelock`), then two at once without turns (a lock folder each, as every
tune timed before turns existed). For each tune: its wall time, its winner's time and noise
flag, and, per config both measured, its search time over the lone tune's (median and worst
over the configs: 1.00 is the quiet machine's figure).

Writes ``bench/results/concurrent_tunes-<cpu>.md``. Figures, never pass/fail.

    python -m bench.concurrent_tunes [--shape M=256,N=256,K=256] [--trials 16] [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import write_result
from tunecache.canonical import canonical_json
from tunecache_cli.table import render

REPO = Path(__file__).resolve().parent.parent


def start(args: argparse.Namespace, folder: Path, locks: Path) -> subprocess.Popen[str]:
    """One ``tunecache tune … --json`` in its own working folders, its locks in ``locks``."""
    env = {**os.environ, "TUNECACHE_LOCK_DIR": str(locks),
           "TUNECACHE_WORK_DIR": str(folder / "work"), "TUNECACHE_OUTBOX": str(folder / "out")}  # fmt: skip
    command = [sys.executable, "-m", "tunecache_cli", "tune", "matmul", "--backend", "tvm",
               "--shape", args.shape, "--strategy", "random", "--seed", "0", "--trials",
               str(args.trials), "--workers", "1", "--no-upload", "--json"]  # fmt: skip
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # fmt: skip


def tunes(args: argparse.Namespace, count: int, shared: bool) -> list[dict[str, Any]]:
    """``count`` tunes at once (their locks in one folder when ``shared``); each one's record
    with its wall seconds under ``"wall_s"``."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        began = time.monotonic()
        procs = [start(args, root / str(i), root / ("locks" if shared else f"locks{i}"))
                 for i in range(count)]  # fmt: skip
        records = []
        for proc in procs:
            out, _ = proc.communicate(timeout=3600)
            if proc.returncode != 0:
                raise SystemExit(f"a tune failed with exit {proc.returncode}")
            records.append({**json.loads(out), "wall_s": time.monotonic() - began})
        return records


def times(record: dict[str, Any]) -> dict[str, float]:
    """Each config's search time in ``record`` (those that ran)."""
    return {canonical_json(t["config"]): t["time_ms"] for t in record["trials"]
            if t["status"] == "ok" and t.get("time_ms")}  # fmt: skip


def row(label: str, run: int, record: dict[str, Any], alone: dict[str, Any]) -> list[str]:
    """One table row: ``record`` beside the lone tune ``alone`` of the same run."""
    mine, quiet = times(record), times(alone)
    ratios = [mine[c] / quiet[c] for c in mine.keys() & quiet.keys()]
    timing = record["timing"]
    noise = "; ".join(timing["conditions"]["noise"]) if timing["noisy"] else "no"
    return [label, str(run), f"{record['wall_s']:.0f}", f"{timing['median_ms']:.4f}", noise,
            f"{statistics.median(ratios):.2f}" if ratios else "-",
            f"{max(ratios):.2f}" if ratios else "-", str(len(ratios))]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="M=256,N=256,K=256")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv)
    rows = []
    for run in range(1, args.runs + 1):
        [alone] = tunes(args, 1, shared=True)
        rows.append(row("alone", run, alone, alone))
        for label, shared in (("two at once, in turns", True), ("two at once, no turns", False)):
            rows += [row(label, run, r, alone) for r in tunes(args, 2, shared)]
        print(f"run {run} done", file=sys.stderr)
    table = render(["tunes", "run", "wall s", "winner ms", "winner noisy", "config/alone median",
                    "worst", "configs"], rows)  # fmt: skip
    notes = [f"key: matmul {args.shape} float32, TVM knobs, strategy random seed 0, "
             f"{args.trials} trials, 1 measurement worker each; the same configs in every tune",
             "config/alone: a config's search time over the lone tune's of the same run "
             "(median and worst over the configs both timed); winner ms: the re-timed winner",
             "turns keep two timings apart, not one tune's compiles from the other's timing: "
             "those show as 'other processes used N cores'"]  # fmt: skip
    write_result("concurrent_tunes", "Two tunes at once: timing in turns or not", notes, table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
