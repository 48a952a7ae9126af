"""Per workload on this CPU: TVM-tuned, Inductor max-autotune and torch eager times, and ratios.

Every time is the validated winner's median (tunecache.timing, perf_counter) on the same inputs.
Prints a table and writes it to ``bench/results/cpu_backends-<cpu>.md``. Figures, never pass/fail.

    python -m bench.cpu_backends [--trials 64] [--workloads matmul,softmax] [--shapes small]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from backends import Budget
from bench.report import write_result
from tunecache import key_for
from tunecache.environment import package_version
from tunecache_cli.table import render
from tuner import tune
from workloads import WORKLOADS, get_workload

SHAPES = {
    "matmul": [{"M": 128, "N": 128, "K": 128}, {"M": 512, "N": 512, "K": 512}],
    "softmax": [{"M": 256, "N": 1024}, {"M": 512, "N": 2048}],
    "layernorm": [{"M": 256, "N": 1024}, {"M": 512, "N": 2048}],
    "bias_gelu": [{"M": 128, "N": 128, "K": 128}, {"M": 512, "N": 512, "K": 512}],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=64, help="TVM MetaSchedule trials per key")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--small", action="store_true", help="only the first shape of each")
    args = parser.parse_args(argv)

    rows = []
    started = time.perf_counter()
    for name in args.workloads.split(","):
        workload = get_workload(name)
        for problem in SHAPES[name][:1] if args.small else SHAPES[name]:
            times: dict[str, float] = {}
            eager = None
            for backend in ("tvm", "inductor"):
                key = key_for(name, backend, problem, "float32")
                outcome = tune(key, Budget(trials=args.trials))
                record = outcome.record
                times[backend] = record.timing.median_ms
                eager = next(
                    b for b in record.baselines if b.name == "torch_eager"
                ).timing.median_ms
                print(
                    f"{name} {problem} {backend}: {times[backend]:.4g} ms "
                    f"({record.config_summary})",
                    file=sys.stderr,
                    flush=True,
                )
            assert eager is not None
            gflops = workload.flops(problem) / 1e6
            rows.append([
                name,
                "x".join(str(v) for v in problem.values()),
                f"{times['tvm']:.4g}",
                f"{times['inductor']:.4g}",
                f"{eager:.4g}",
                f"{eager / times['tvm']:.2f}x",
                f"{eager / times['inductor']:.2f}x",
                f"{gflops / min(times.values(), default=eager):.1f}",
            ])  # fmt: skip
    header = ["workload", "shape", "tvm ms", "inductor ms", "eager ms", "eager/tvm",
              "eager/inductor", "tuned GFLOP/s"]  # fmt: skip
    table = render(header, rows)
    print(table)
    write_result(
        "cpu_backends",
        "CPU backends: TVM-tuned vs Inductor max-autotune vs torch eager",
        [
            f"torch {torch.__version__}, apache-tvm {package_version('apache-tvm')}, float32",
            f"TVM: MetaSchedule, {args.trials} trials per key; Inductor: max-autotune (freezing on)",
            "times: median ms of the validated winner, perf_counter, warm-up first, same inputs",
            f"{time.perf_counter() - started:.0f} s in all",
        ],
        table,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
