"""Tuning cost on a GPU: wall time per key for 200 configs, and how good the best found is.

Keys: bf16 GEMMs at a Llama-3-8B projection, decode and prefill (``16×6144×4096``,
``2048×6144×4096``), and an rmsnorm row (``8192×4096``). Each is tuned by tunecache's own
search with 200 trials and no seconds budget through one warm harness (a worker per core; the
first key pays the start-up, and says so), then its winner is timed as in the kernel table.
Candidates compile in the harness's compile farm, on every core, ahead of the one process that
times them, which should compile nothing (the table counts its compiles); ``--no-farm`` compiles
each in the worker that times it instead, as before the farm. Where a brute-forced landscape of
the key exists for this GPU (``bench/landscapes/``: an H100, before split-K), the best found is
compared with the landscape's optimum.

    python -m bench.gpu.tuning_throughput             # one device call
    python -m bench.gpu.tuning_throughput --no-farm   # the same without the compile farm
    python -m bench.gpu.tuning_throughput --dry-run   # on a CPU: the plan
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.gpu.common import device_name, embedded_server, markdown, software, write_table
from bench.gpu.kernels import Plan, check_and_time, space_size, tune_key

LANDSCAPES = Path(__file__).resolve().parents[1] / "landscapes"
KEYS = (
    Plan("matmul", "qkv M=16", {"M": 16, "N": 6144, "K": 4096}, "bfloat16"),
    Plan("matmul", "qkv M=2048", {"M": 2048, "N": 6144, "K": 4096}, "bfloat16"),
    Plan("rmsnorm", "8192x4096", {"M": 8192, "N": 4096}, "bfloat16"),
)


def landscape_best(plan: Plan, device: str | None) -> float | None:
    """The optimum of a landscape recorded for ``plan``'s key on ``device`` (any GPU when
    ``None``), in ms, or ``None``: a landscape of another GPU is no yardstick (an H100's
    optimum against an H200's times)."""
    from tuner.landscape import Landscape

    shape = "x".join(str(v) for v in plan.problem.values())
    dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[plan.dtype]
    for path in LANDSCAPES.glob(f"tunecache_{plan.kernel}_{dtype}_{shape}_*.json*"):
        landscape = Landscape.load(path)
        if device is not None and landscape.device != device:
            continue
        times = [e.time_ms for e in landscape.entries if e.time_ms is not None]
        return min(times) if times else None
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu.tuning_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--no-farm", action="store_true", help="compile each candidate in the worker that times it"
    )
    parser.add_argument("--dry-run", action="store_true", help="check the plan; run nothing")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.workers < 1:
        parser.error("--trials and --workers must be at least 1")
    if args.dry_run:
        for plan in KEYS:
            best = landscape_best(plan, None)
            known = "no landscape" if best is None else f"landscape optimum {best:.4g} ms"
            print(f"{plan.kernel:8} {plan.label:11} space {space_size(plan)}; {known}")
        farm = "each in its timing worker" if args.no_farm else "in the compile farm"
        print(f"{len(KEYS)} keys x {args.trials} trials, {args.workers} workers, compiled {farm}; "
              "run on a GPU machine without --dry-run")  # fmt: skip
        return 0
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU here: run with --dry-run on a CPU", file=sys.stderr)
        return 2
    return run(args)


def run(args: argparse.Namespace) -> int:
    import torch

    from backends.triton import TritonBackend
    from tunecache import Client
    from tuner.harness import Harness
    from workloads import get_workload

    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        url, token = stack.enter_context(embedded_server(Path(tmp) / "c.db"))
        client = stack.enter_context(Client(url, token=token))
        harness = stack.enter_context(Harness(workers=args.workers))
        if not args.no_farm:
            _ = harness.farm  # started before the first key: part of the start-up
        start_s = time.perf_counter() - started
        backend = TritonBackend()
        here = torch.cuda.get_device_name(0)
        for plan in KEYS:
            outcome, wall = tune_key(plan, harness, args.trials, 1e9, client,
                                     compile_ahead=not args.no_farm)  # fmt: skip
            workload = get_workload(plan.kernel)
            inputs = tuple(t.cuda() for t in workload.make_inputs(plan.problem, plan.dtype, 7))
            winner = backend.build(workload, plan.problem, plan.dtype, outcome.record.config)
            ms, error = check_and_time(winner, inputs, workload.reference(*inputs),
                                       workload.output_shape(plan.problem), True)  # fmt: skip
            rows.append({"label": f"{plan.kernel} {plan.label}", "trials": len(outcome.trials),
                         "tune_s": wall, "per_config_s": wall / max(1, len(outcome.trials)),
                         "best_ms": ms, "error": error, "optimum_ms": landscape_best(plan, here),
                         "timer_compiles": outcome.timer_compiles,
                         "config": backend.summarize(outcome.record.config)})  # fmt: skip
            print(rows[-1], flush=True)
    table = markdown(
        ["key", "trials", "tune s", "s per config", "compiles in the timing process",
         "best found ms", "landscape optimum ms", "optimum / found", "config"],
        [[r["label"], r["trials"], r["tune_s"], r["per_config_s"], r["timer_compiles"],
          r["best_ms"], r["optimum_ms"] if r["optimum_ms"] is not None else float("nan"),
          (r["optimum_ms"] or float("nan")) / r["best_ms"], r["config"]] for r in rows],
    )  # fmt: skip
    notes = [
        f"device: {device_name()}; {software()}",
        f"harness start-up ({args.workers} workers"
        + ("" if args.no_farm else f", {args.workers} compile processes")
        + f"), before the first key: {start_s:.1f} s",
        f"{args.trials} trials per key, no seconds budget; the default search strategy",
        "candidates compiled "
        + (
            "each in the worker that times it (--no-farm)"
            if args.no_farm
            else f"in the compile farm ({args.workers} processes)"
        ),
    ]
    name = "tuning_throughput-gpu" + ("-no-farm" if args.no_farm else "")
    write_table(name, "Tuning throughput on the GPU", notes, table, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
