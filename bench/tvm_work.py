"""How far MetaSchedule's own schedules walk a block past its iteration space, and whether
:func:`tunecache.tvm.check.work_problem` (the bound a served trace is held to) refuses any.

For each built-in workload with a TVM compute, at small and odd shapes, for an ``llvm`` and a
``cuda`` target, generates MetaSchedule's design spaces (``post-order-apply``, the default rules:
tiles, caches computed inside tiles, rfactor, cross-thread reductions) under many seeds, and
measures, for each block, the iterations of the loops its bindings or bounds check name over its
iteration space (:func:`tunecache.tvm.check.work_problem`), and whether the check refuses the
schedule. Needs no GPU (a design space is generated, never built).

Writes ``bench/results/tvm_work-<cpu>.md``: per workload and target, the schedules generated,
the largest and median padding, and how many the check refuses. Figures, never pass/fail.

    python -m bench.tvm_work [--seeds 20]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from bench.report import write_result
from tunecache.tvm.check import MAX_PADDING, _nests, work_problem
from tunecache_cli.table import render
from workloads import WORKLOADS

SHAPES = {  # a small shape and one no tile divides
    "matmul": ({"M": 64, "N": 64, "K": 64}, {"M": 100, "N": 37, "K": 129}),
    "softmax": ({"M": 64, "N": 128}, {"M": 37, "N": 1000}),
    "layernorm": ({"M": 64, "N": 128}, {"M": 37, "N": 1000}),
    "rmsnorm": ({"M": 64, "N": 128}, {"M": 37, "N": 1000}),
    "bias_gelu": ({"M": 64, "N": 64, "K": 64}, {"M": 100, "N": 37, "K": 129}),
}
TARGETS = {
    "llvm": {"kind": "llvm", "num-cores": 2},
    "cuda": {"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 1024,
             "max_shared_memory_per_block": 49152, "thread_warp_size": 32},
}  # fmt: skip


def paddings(func: Any, target: dict[str, Any], seeds: int) -> tuple[list[float], int]:
    """The largest padding of a block of each design space generated for ``func`` under
    ``seeds`` seeds, and how many of those spaces :func:`work_problem` refuses."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.target import Target

    from backends.tvm.database import normalize_module

    mod = normalize_module(func)
    found: list[float] = []
    refused = 0
    for seed in range(1, seeds + 1):
        context = ms.TuneContext(mod=mod, target=Target(target), task_name="main",
                                 space_generator="post-order-apply", rand_state=seed)  # fmt: skip
        for space in context.generate_design_space():
            nests = _nests(space.mod) or []
            found.append(max(math.prod(e for _, e, named in loops if named) / size
                             for _, size, loops in nests))  # fmt: skip
            refused += work_problem(space, mod) is not None
    return found, refused


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args(argv)
    from tvm import te

    rows = []
    for name, shapes in SHAPES.items():
        workload = WORKLOADS[name]
        for target_name, target in TARGETS.items():
            found: list[float] = []
            refused = 0
            for shape in shapes:
                func = te.create_prim_func(workload.tvm_compute(shape, "float32"))
                more, refusals = paddings(func, target, args.seeds)
                found, refused = found + more, refused + refusals
            rows.append([name, target_name, str(len(found)), f"{max(found):.3g}",
                         f"{statistics.median(found):.3g}", str(refused)])  # fmt: skip
            print(" ".join(rows[-1]), file=sys.stderr, flush=True)
    table = render(["workload", "target", "schedules", "largest padding", "median", "refused"],
                   rows)  # fmt: skip
    notes = [f"shapes: {', '.join(f'{n} {s}' for n, s in SHAPES.items())}",
             f"seeds per shape and target: {args.seeds}; MAX_PADDING is {MAX_PADDING}",
             "padding: a block's iterations over the loops its bindings or bounds check name, "
             "over its iteration space; the largest block's of each schedule",
             "loops bound to GPU threads not counted (they run side by side)",
             "refused: schedules tunecache.tvm.check.work_problem refuses (none should be; it "
             "bounds a block by the module's largest block, not its own space)"]  # fmt: skip
    write_result("tvm_work", "How far MetaSchedule's own schedules pad a block's loops", notes,
                 table)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
