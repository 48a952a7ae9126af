"""The kernel table on a GPU: each key tuned by tunecache's own search, uploaded to an embedded
server, fetched back, and timed against cuBLAS / torch eager, Inductor and the default config.

One command per part, each well inside a 9-minute device call::

    python -m bench.gpu.kernels gemm --dtypes bfloat16            # 16 Llama-3-8B GEMM keys
    python -m bench.gpu.kernels gemm --dtypes float16
    python -m bench.gpu.kernels rows                              # softmax, norms, bias+GELU
    python -m bench.gpu.kernels gemm --dry-run                    # on a CPU: the plan only

Per key: the pruned space's size, the trials, the tuning wall time (search, re-timing,
validation), the validation's worst error, and where the record was keyed (it must name the GPU,
never the host CPU). Every candidate in the table is checked against the float64 reference on
fresh inputs, with its output poisoned, before it is timed (CUDA events, L2 flushed, median).
GEMMs report TFLOP/s and the fraction of the measured bf16 ``torch.mm`` peak; the others bytes
moved (inputs read once, output written once) per second and the fraction of the measured copy
bandwidth. Inductor is ``torch.compile(mode="max-autotune-no-cudagraphs")``: max-autotune's
kernel choices without CUDA graphs, so every column launches one kernel per call.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.gpu.common import (
    LLAMA3_8B,
    Ceilings,
    device_name,
    embedded_server,
    geomean,
    load_ceilings,
    markdown,
    rel_error,
    software,
    time_ms,
    write_table,
)
from tunecache.timing import TimerSettings

GEMM_MS = (16, 128, 2048, 8192)
ROW_KEYS: tuple[tuple[str, dict[str, int], str], ...] = (
    ("softmax", {"M": 4096, "N": 4096}, "float16"),
    ("softmax", {"M": 8192, "N": 4096}, "bfloat16"),
    ("layernorm", {"M": 8192, "N": 4096}, "bfloat16"),
    ("rmsnorm", {"M": 8192, "N": 4096}, "bfloat16"),
    ("rmsnorm", {"M": 2048, "N": 8192}, "float16"),
    ("bias_gelu", {"M": 16, "N": 14336, "K": 4096}, "bfloat16"),
    ("bias_gelu", {"M": 2048, "N": 14336, "K": 4096}, "bfloat16"),
)


@dataclass(frozen=True)
class Plan:
    kernel: str
    label: str
    problem: dict[str, int]
    dtype: str


def gemm_plan(dtypes: list[str], ms: list[int]) -> list[Plan]:
    return [
        Plan("matmul", f"{proj} M={m}", {"M": m, "N": n, "K": k}, dtype)
        for dtype, m, (proj, (n, k)) in itertools.product(dtypes, ms, LLAMA3_8B.items())
    ]


def row_plan() -> list[Plan]:
    return [Plan(k, "x".join(str(v) for v in p.values()), p, d) for k, p, d in ROW_KEYS]


def space_size(plan: Plan) -> int:
    from backends.triton import TritonBackend
    from workloads import get_workload

    space = TritonBackend().space(get_workload(plan.kernel), plan.problem, plan.dtype)
    return sum(1 for _ in space.configs())


def moved_bytes(inputs: tuple[Any, ...], out: Any) -> int:
    return sum(t.numel() * t.element_size() for t in (*inputs, out))


def check_and_time(fn: Any, inputs: tuple[Any, ...], ref: Any, shape: tuple[int, ...],
                   takes_out: bool) -> tuple[float, float]:  # fmt: skip
    """``(median ms, relative error)``: the output poisoned with NaN first where it is a
    buffer the callable fills."""
    import torch

    if takes_out:
        out = torch.full(shape, float("nan"), dtype=inputs[0].dtype, device="cuda")
        fn(*inputs, out=out)
    else:
        out = fn(*inputs)
    torch.cuda.synchronize()
    error = rel_error(out, ref)
    return time_ms(lambda: fn(*inputs)), error


def inductor(fn: Any, inputs: tuple[Any, ...]) -> tuple[Any, float]:
    """``fn`` compiled with max-autotune (no CUDA graphs), and its compile seconds."""
    import torch

    torch._dynamo.reset()
    compiled = torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)
    start = time.perf_counter()
    compiled(*inputs)
    torch.cuda.synchronize()
    return compiled, time.perf_counter() - start


SEARCH_TIMER = TimerSettings(warmup=2, min_repeats=10, max_repeats=100, target_s=0.05)


def tune_key(plan: Plan, harness: Any, trials: int, seconds: float, client: Any = None,
             backend: Any = None, compile_ahead: bool = True) -> tuple[Any, float]:  # fmt: skip
    """``(outcome, wall seconds)`` of tunecache's own tune of ``plan``'s key on this GPU.

    ``backend`` replaces the Triton backend (a restricted space); its workers import it by
    ``module:Class``. ``compile_ahead=False`` compiles each candidate in the worker that times
    it instead of the compile farm.
    """
    from backends import Budget
    from tunecache import key_for
    from tuner.tune import TuneOptions, tune

    key = key_for(plan.kernel, "triton", plan.problem, plan.dtype)
    ref = None if backend is None else f"{type(backend).__module__}:{type(backend).__qualname__}"
    options = TuneOptions(timer=SEARCH_TIMER, backend_ref=ref, compile_ahead=compile_ahead)
    started = time.perf_counter()
    outcome = tune(key, Budget(trials=trials, seconds=seconds), options, harness=harness,
                   backend=backend, cache=client)  # fmt: skip
    return outcome, time.perf_counter() - started


def run_key(plan: Plan, url: str, token: str, harness: Any, trials: int, seconds: float,
            with_inductor: bool) -> dict[str, Any]:  # fmt: skip

    from backends.triton import TritonBackend
    from tunecache import Client
    from workloads import get_workload

    workload = get_workload(plan.kernel)
    started = time.perf_counter()
    with Client(url, token=token) as client:
        outcome, _ = tune_key(plan, harness, trials, seconds, client)
        client.upload(outcome.record)
        wall = time.perf_counter() - started
        fetched = client.fetch(outcome.key)
    key = outcome.key
    assert fetched is not None, f"{key.short()}: the record uploaded is not served back"
    backend = TritonBackend()
    inputs = tuple(t.cuda() for t in workload.make_inputs(plan.problem, plan.dtype, seed=7))
    ref = workload.reference(*inputs)
    shape = workload.output_shape(plan.problem)
    row: dict[str, Any] = {
        "kernel": plan.kernel, "label": plan.label, "problem": plan.problem, "dtype": plan.dtype,
        "key_device": f"{key.device.arch} / {key.device.name}",
        "record_device": f"{fetched.key.device.arch} / {fetched.key.device.name}",
        "space": space_size(plan), "trials": outcome.record.search.trials,
        "tune_s": round(wall, 1), "validation_error": outcome.record.validation.max_rel_error,
        "config": backend.summarize(fetched.config),
    }  # fmt: skip
    tuned = backend.build(workload, plan.problem, plan.dtype, fetched.config)
    default_config = workload.default_config("triton", plan.problem, plan.dtype)
    default = backend.build(workload, plan.problem, plan.dtype, default_config)
    row["tuned_ms"], row["tuned_err"] = check_and_time(tuned, inputs, ref, shape, True)
    row["default_ms"], row["default_err"] = check_and_time(default, inputs, ref, shape, True)
    time_torch(row, workload, inputs, ref, shape, with_inductor, eager="torch")
    row["flops"] = workload.flops(plan.problem) if hasattr(workload, "flops") else 0
    return row


def per_second(row: dict[str, Any], amount: str, col: str) -> float:
    """``row[amount]`` (bytes, flops) per second at the time in ``row[col]`` (ms), in tera
    (TB/s, TFLOP/s); NaN where the row has no such time."""
    ms = row.get(col)
    return row[amount] / (ms / 1e3) / 1e12 if ms else float("nan")


def tflops(row: dict[str, Any], col: str) -> float:
    return per_second(row, "flops", col)


def tbs(row: dict[str, Any], col: str) -> float:
    return per_second(row, "bytes", col)


def gemm_table(rows: list[dict[str, Any]], ceilings: Ceilings) -> tuple[str, list[str]]:
    table = markdown(
        ["dtype", "shape", "M×N×K", "tuned config", "tuned TF/s", "of peak", "cuBLAS TF/s",
         "tuned/cuBLAS", "default TF/s", "tuned/default", "Inductor TF/s", "tuned/Inductor",
         "space", "trials", "tune s", "val. error"],
        [[r["dtype"], r["label"], "x".join(str(v) for v in r["problem"].values()), r["config"],
          tflops(r, "tuned_ms"), tflops(r, "tuned_ms") / ceilings.mm_tflops,
          tflops(r, "torch_ms"), r["torch_ms"] / r["tuned_ms"], tflops(r, "default_ms"),
          r["default_ms"] / r["tuned_ms"], tflops(r, "inductor_ms"),
          r.get("inductor_ms", float("nan")) / r["tuned_ms"], r["space"], r["trials"],
          r["tune_s"], r["validation_error"]] for r in rows],
    )  # fmt: skip
    largest = max(rows, key=lambda r: r["flops"])
    with_inductor = [r for r in rows if r.get("inductor_ms")]
    heads = [
        f"geomean tuned/cuBLAS {geomean([r['torch_ms'] / r['tuned_ms'] for r in rows]):.3f}, "
        f"tuned/default {geomean([r['default_ms'] / r['tuned_ms'] for r in rows]):.3f}, "
        "tuned/Inductor "
        f"{geomean([r['inductor_ms'] / r['tuned_ms'] for r in with_inductor]):.3f} (over the "
        f"{len(with_inductor)} keys timed with Inductor)",
        f"largest ({largest['label']}, {largest['dtype']}): {tflops(largest, 'tuned_ms'):.0f} "
        f"TFLOP/s = {tflops(largest, 'tuned_ms') / ceilings.mm_tflops:.2f} of the measured peak",
        f"tuning wall time per key: median {sorted(r['tune_s'] for r in rows)[len(rows) // 2]} s,"
        f" max {max(r['tune_s'] for r in rows)} s",
    ]
    return table, heads


def rows_table(rows: list[dict[str, Any]], ceilings: Ceilings) -> tuple[str, list[str]]:
    table = markdown(
        ["kernel", "shape", "dtype", "tuned config", "tuned ms", "TB/s", "of copy",
         "eager ms", "tuned/eager", "Inductor ms", "tuned/Inductor", "default ms",
         "tuned/default", "space", "trials", "tune s", "val. error"],
        [[r["kernel"], r["label"], r["dtype"], r["config"], r["tuned_ms"], tbs(r, "tuned_ms"),
          tbs(r, "tuned_ms") / ceilings.copy_tbs, r["torch_ms"], r["torch_ms"] / r["tuned_ms"],
          r.get("inductor_ms", float("nan")),
          r.get("inductor_ms", float("nan")) / r["tuned_ms"], r["default_ms"],
          r["default_ms"] / r["tuned_ms"], r["space"], r["trials"], r["tune_s"],
          r["validation_error"]] for r in rows],
    )  # fmt: skip
    bound = [r for r in rows if r["kernel"] != "bias_gelu" or r["problem"]["M"] <= 64]
    heads = [
        "memory-bound keys' fraction of copy bandwidth: geomean "
        f"{geomean([tbs(r, 'tuned_ms') / ceilings.copy_tbs for r in bound]):.2f}",
        f"geomean tuned/eager {geomean([r['torch_ms'] / r['tuned_ms'] for r in rows]):.3f}, "
        f"tuned/default {geomean([r['default_ms'] / r['tuned_ms'] for r in rows]):.3f}",
    ]
    return table, heads


def report(args: argparse.Namespace, rows: list[dict[str, Any]], skipped: list[str],
           ceilings: Ceilings, *, quiet: bool) -> None:  # fmt: skip
    """Writes the part's table (and prints it unless ``quiet``)."""
    table, heads = (gemm_table if args.part == "gemm" else rows_table)(rows, ceilings)
    notes = [
        f"device: {device_name()}; {software()}",
        f"ceilings: copy {ceilings.copy_tbs:.2f} TB/s (read + write), bf16 8192³ torch.mm "
        f"{ceilings.mm_tflops:.0f} TFLOP/s, {ceilings.source}",
        f"search: tunecache's default strategy, {args.trials} trials or {args.seconds:g} s per "
        f"key, {args.workers} harness workers; winners uploaded to an embedded server and "
        "fetched back before timing",
        "records keyed: " + ", ".join(sorted({r["record_device"] for r in rows})),
        *heads,
        *(["not run (time or failure): " + "; ".join(skipped)] if skipped else []),
    ]
    name = f"kernels-{args.part}-{'-'.join(sorted(set(r['dtype'] for r in rows)))}"
    write_table(name, f"Kernel table: {args.part}", notes, table, rows, quiet=quiet)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu.kernels",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("part", choices=("gemm", "rows"))
    parser.add_argument("--dtypes", default="bfloat16,float16")
    parser.add_argument("--ms", default=",".join(map(str, GEMM_MS)))
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=25.0, help="search budget per key")
    parser.add_argument("--workers", type=int, default=8, help="harness worker processes")
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--ceilings", type=Path, help="ceilings.json (else measured now)")
    parser.add_argument(
        "--stop-after",
        type=float,
        default=480.0,
        help="start no new key after this many seconds (default 480)",
    )
    parser.add_argument("--dry-run", action="store_true", help="check the plan; run nothing")
    args = parser.parse_args(argv)
    dtypes = args.dtypes.split(",")
    for dtype in dtypes:
        if dtype not in ("bfloat16", "float16", "float32"):
            parser.error(f"--dtypes: {dtype!r} is not bfloat16, float16 or float32")
    try:
        ms = [int(m) for m in args.ms.split(",")]
    except ValueError:
        parser.error(f"--ms: {args.ms!r} is not a comma-separated list of integers")
    plan = gemm_plan(dtypes, ms) if args.part == "gemm" else row_plan()
    if args.dry_run:
        return dry_run(plan, lambda item: f"{item.kernel:10} {item.label:18} {item.dtype:9} "
                       f"{item.problem} space {space_size(item)}", "")  # fmt: skip
    return run_keys(args, plan, run_key, report, summary)


def summary(row: dict[str, Any]) -> str:
    return (f"{row['kernel']} {row['label']} {row['dtype']}: tuned {row['tuned_ms']:.4g} ms, "
            f"torch {row['torch_ms']:.4g} ms, default {row['default_ms']:.4g} ms, "
            f"{row['tune_s']} s, keyed {row['record_device']}")  # fmt: skip


def dry_run(plan: Sequence[Plan], line: Callable[[Plan], str], how: str) -> int:
    """What a run would do on a GPU, a ``line`` per key of ``plan``, on this machine: exit 0."""
    for item in plan:
        print(line(item))
    print(f"{len(plan)} keys{how}; run on a GPU machine without --dry-run")
    return 0


def time_torch(row: dict[str, Any], workload: Any, inputs: tuple[Any, ...], ref: Any,
               shape: tuple[int, ...], with_inductor: bool, *, eager: str) -> None:  # fmt: skip
    """Adds to ``row`` torch's own times (eager as ``{eager}_ms``, and Inductor's max-autotune
    unless not ``with_inductor``), checked against ``ref``, and the bytes the op moves."""
    import torch

    row[f"{eager}_ms"], row[f"{eager}_err"] = check_and_time(workload.torch_fn, inputs, ref,
                                                             shape, False)  # fmt: skip
    if with_inductor:
        compiled, row["inductor_compile_s"] = inductor(workload.torch_fn, inputs)
        row["inductor_ms"], row["inductor_err"] = check_and_time(compiled, inputs, ref, shape,
                                                                 False)  # fmt: skip
    row["bytes"] = moved_bytes(inputs, torch.empty(shape, dtype=inputs[0].dtype, device="cuda"))


def run_keys(args: argparse.Namespace, plan: list[Plan], run_key: Callable[..., dict[str, Any]],
             report: Callable[..., None], summary: Callable[[dict[str, Any]], str]) -> int:  # fmt: skip
    """Runs ``run_key`` on each key of ``plan`` through one harness and one embedded server,
    rewriting the table after each (a run killed at its time limit keeps what it did); starts
    no key after ``args.stop_after`` seconds. One key's failure is a line of the notes."""
    import torch

    from tuner.harness import Harness

    if not torch.cuda.is_available():
        print("no CUDA GPU here: run with --dry-run on a CPU", file=sys.stderr)
        return 2
    started = time.perf_counter()
    ceilings = load_ceilings(args.ceilings)
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, embedded_server(Path(tmp) / "cache.db") as (
        url, token), Harness(workers=args.workers) as harness:  # fmt: skip
        _ = harness.farm  # started before the first key, not within its seconds
        for item in plan:
            name = f"{item.kernel} {item.label} {item.dtype}"
            if time.perf_counter() - started > args.stop_after:
                skipped.append(name)
                continue
            try:
                row = run_key(item, url, token, harness, args.trials, args.seconds,
                              not args.no_inductor)  # fmt: skip
            except Exception as exc:
                traceback.print_exc()
                skipped.append(f"{name} (failed: {exc})"[:300])
                continue
            rows.append(row)
            report(args, rows, skipped, ceilings, quiet=True)
            print(summary(row), flush=True)
    if not rows:
        print("no key finished", file=sys.stderr)
        return 1
    report(args, rows, skipped, ceilings, quiet=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
