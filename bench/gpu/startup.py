"""Start-up table: a process launching 50 GEMM shapes through ``tunecache.triton.autotune``
served from the cache, against plain ``triton.autotune`` tuning locally.

Four fresh processes on one GPU, one embedded cache server (SQLite):

1. ``pretune``: ``tunecache.triton.autotune`` on an empty cache tunes every shape as Triton would
   (the 8 tutorial configs benchmarked with ``do_bench``), validates and uploads the winners; it
   also leaves Triton's compiled kernels on disk, so the two runs after it compile nothing;
2. ``cached``: the same launches in a new process, served from the cache;
3. ``verified``: the same with ``verify="first"``: each served config's first launch is checked
   against the reference (``a @ b``) on copies of the inputs: its cost, and that none is refused;
4. ``plain``: the same launches under ``triton.autotune``.

Each reports the seconds from its first launch to the last one's end and Triton's benchmark calls.

    python -m bench.gpu.startup              # on a GPU machine
    python -m bench.gpu.startup --dry-run    # on a CPU: the shapes and processes only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.gpu.common import (
    LLAMA3_8B,
    device_name,
    embedded_server,
    markdown,
    software,
    write_table,
)

MS = (1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
SHAPES = [(m, *nk) for m in MS for nk in (*LLAMA3_8B.values(), (11008, 4096))]  # 50
MODES = ("pretune", "cached", "verified", "plain")


def child(mode: str) -> int:
    """Launches every shape once with the ``mode`` tuner; prints a JSON line."""
    import torch

    from bench.gpu import startup_kernel as kernel

    tuner = {"pretune": kernel.cached, "cached": kernel.cached, "verified": kernel.verified,
             "plain": kernel.plain}[mode]  # fmt: skip
    checks: list[bool] = []
    if mode == "verified":  # counts the served configs checked, and those that passed
        verifier = tuner._verifier

        def counting_verifier(*args: Any) -> Any:
            verify = verifier(*args)

            def counted(config: Any) -> Any:
                try:
                    found = verify(config)
                except Exception:
                    checks.append(False)
                    raise
                checks.append(bool(found.passed))
                return found

            return counted

        tuner._verifier = counting_verifier
    tensors = {}
    for m, n, k in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(m * 7 + n + k)
        tensors[(m, n, k)] = (
            torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen),
            torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen),
        )
    torch.cuda.synchronize()
    started = time.perf_counter()
    worst = 0.0
    for shape in SHAPES:
        a, b = tensors[shape]
        c = kernel.launch(tuner, a, b)
        torch.cuda.synchronize()
        ref = a.double() @ b.double()
        worst = max(worst, float((c.double() - ref).norm() / ref.norm()))
    seconds = time.perf_counter() - started
    print(json.dumps({"mode": mode, "seconds": seconds, "bench_calls": len(kernel.BENCH_CALLS),
                      "shapes": len(SHAPES), "worst_error": worst,
                      "checked": len(checks), "passed": sum(checks)}))  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu.startup",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--dry-run", action="store_true", help="print the shapes; run nothing")
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child)
    if args.dry_run:
        print(f"{len(SHAPES)} shapes (M, N, K), bf16: {SHAPES}")
        print(f"processes, in order: {', '.join(MODES)}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU here: run with --dry-run on a CPU", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp, embedded_server(Path(tmp) / "c.db") as (url, token):
        env = {**os.environ, "TUNECACHE_URL": url, "TUNECACHE_TOKEN": token,
               "TRITON_CACHE_DIR": str(Path(tmp) / "triton")}  # fmt: skip
        for mode in MODES:
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "bench.gpu.startup", "--child", mode],
                                  env=env, capture_output=True, text=True, timeout=400)  # fmt: skip
            if done.returncode != 0:
                print(done.stdout, done.stderr, file=sys.stderr)
                return 1
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["process_s"] = time.perf_counter() - started
            rows.append(row)
            print(row, flush=True)
    table = markdown(
        ["process", "shapes", "seconds launching", "benchmark calls", "served configs checked",
         "checks passed", "process wall s", "worst error vs float64"],
        [[r["mode"], r["shapes"], r["seconds"], r["bench_calls"], r["checked"], r["passed"],
          r["process_s"], r["worst_error"]] for r in rows],
    )  # fmt: skip
    notes = [
        f"device: {device_name()}; {software()}",
        "the tutorial GEMM (8 configs) at 50 bf16 shapes: M in "
        f"{list(MS)} x Llama-3-8B projections (N, K)",
        "Triton's compiled kernels were on disk for the processes after 'pretune' (left by it)",
        "'verified': verify='first', each served config checked once against a @ b",
    ]
    write_table("startup", "Start-up: served from the cache vs triton.autotune", notes, table,
                rows)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
