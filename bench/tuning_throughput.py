"""What tuning costs apart from the kernels: compile throughput, harness overhead, first result.

1. **Compile throughput for ``sm_90``** with 1, 2 and all cores: the ``matmul`` kernel's configs
   at a Llama-3-8B shape compiled by Triton's compiler for an H100 (``GPUTarget("cuda", 90,
   32)``; no GPU needed), each process with its own empty cache; configs per second.
   The same through the harness's compile farm (:mod:`tuner.harness.farm`: the product's path,
   each config compiled by a launch in compile-only mode, answers over pipes).
2. **Harness overhead per candidate**: a batch of candidates whose build and run are trivial,
   through the harness's worker processes (build, check against the reference, time); the wall
   time per candidate beyond its timed runs. The same through the compile farm and the one
   timing process (a candidate "compiled ahead" instantly).
3. **Time to first result** of a new key: with a cold harness (worker processes started for it)
   and a warm one (started before, serving another key already), for the trivial backend and
   for the Triton ``matmul`` kernel (in Triton's interpreter on a CPU).

Results go to ``bench/results/tuning_throughput-<cpu>.md``. Figures, never pass/fail.

    python -m bench.tuning_throughput [--configs 16] [--candidates 64]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from backends import Backend, Runnable, Target
from bench.report import write_result
from tunecache.space import Config, SearchSpace
from tunecache_cli.table import render

REPO = Path(__file__).resolve().parent.parent
SHAPE = {"M": 2048, "N": 4096, "K": 4096}


# -- 1. compile throughput --------------------------------------------------------------------


def compile_one(config: dict[str, int]) -> float:
    """Compiles ``matmul``'s kernel with ``config`` for sm_90; returns its seconds."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import workloads.matmul.triton as mt

    fn = mt.matmul_kernel.jit()
    types = {"a_ptr": "*bf16", "b_ptr": "*bf16", "bias_ptr": "*bf16", "c_ptr": "*bf16",
             "ws_ptr": "*fp32"}  # fmt: skip
    meta = {k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K")}
    constants = {**meta, "DOT_PRECISION": "tf32", "DOT_IN_FP32": False, "EPILOGUE": "none"}
    signature = {n: types.get(n, "i32") for n in fn.arg_names}
    signature.update({n: "constexpr" for n in constants})
    where = {(fn.arg_names.index(n),): v for n, v in constants.items()}
    started = time.perf_counter()
    triton.compile(ASTSource(fn, signature, where), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": config["num_warps"],
                            "num_stages": config["num_stages"]})  # fmt: skip
    return time.perf_counter() - started


def _init_worker(cache: str) -> None:
    os.environ["TRITON_CACHE_DIR"] = cache
    os.environ.pop("TRITON_INTERPRET", None)


def compile_throughput(configs: list[dict[str, int]], workers: int) -> tuple[float, float]:
    """``(configs per second, mean seconds per compile)`` with ``workers`` processes."""
    spawn = multiprocessing.get_context("spawn")  # a fresh Triton, not the interpreter's
    with (
        tempfile.TemporaryDirectory() as cache,
        ProcessPoolExecutor(
            workers, mp_context=spawn, initializer=_init_worker, initargs=(cache,)
        ) as pool,
    ):
        list(pool.map(compile_one, [configs[0]] * workers))  # imports and start-up, untimed
        started = time.perf_counter()
        each = list(pool.map(compile_one, configs[1:]))
        wall = time.perf_counter() - started
    return len(each) / wall, sum(each) / len(each)


def farm_throughput(configs: list[dict[str, int]], workers: int) -> dict[str, float]:
    """The harness's compile farm compiling for sm_90 with ``workers`` processes, into an
    empty Triton cache: ``rate`` (configs per second after a first compile per process),
    ``start`` (seconds until every process is ready), ``first`` and ``next`` (a compile's
    seconds, as its answer reports them: each process's first, the later ones)."""
    from backends.base import Target
    from backends.triton import DeviceLimits
    from tuner.harness import Task
    from tuner.harness.farm import CompileFarm

    task = Task(backend="triton", workload="matmul", problem=SHAPE, dtype="bfloat16",
                device="cuda", target=Target("cuda", "sm_90", DeviceLimits.H100))  # fmt: skip
    warm = [c for c in gemm_configs(len(configs) + workers, offset=1) if c not in configs][:workers]
    with tempfile.TemporaryDirectory() as cache:
        previous = os.environ.get("TRITON_CACHE_DIR")
        os.environ["TRITON_CACHE_DIR"] = cache  # the farm's processes inherit it
        started = time.perf_counter()
        farm = CompileFarm(workers=workers, timeout=600, start_timeout=180)
        try:
            start = time.perf_counter() - started
            first = _drain(farm, task, warm)  # one a process: each is idle when it is handed out
            started = time.perf_counter()
            later = _drain(farm, task, configs[1:])
            rate = (len(configs) - 1) / (time.perf_counter() - started)
            return {"rate": rate, "start": start, "first": sum(first) / len(first),
                    "next": sum(later) / len(later)}  # fmt: skip
        finally:
            farm.close()
            if previous is None:
                os.environ.pop("TRITON_CACHE_DIR")
            else:
                os.environ["TRITON_CACHE_DIR"] = previous


def _drain(farm: Any, task: Any, configs: list[dict[str, int]]) -> list[float]:
    """Compiles ``configs`` in ``farm``, every one of which must compile; their seconds."""
    answers = list(farm.compile_all(task, configs).values())
    for answer in answers:
        assert answer.ok and answer.seconds is not None, answer
    return [answer.seconds for answer in answers]


def gemm_configs(count: int, offset: int = 0) -> list[dict[str, int]]:
    """``count + 1`` configs spread over the space (``offset`` shifts them by that many)."""
    from backends.triton import DeviceLimits
    from workloads.triton_kit.spaces import gemm_space

    space = list(gemm_space(SHAPE, "bfloat16", DeviceLimits.H100).configs())
    step = max(1, len(space) // (count + 1))
    return [c.to_json() for c in space[offset::step][: count + 1]]  # type: ignore[misc]


# -- 2, 3. the harness ------------------------------------------------------------------------


class Trivial(Backend):
    """Candidates that build instantly and run the workload's own torch function."""

    name = "trivial"

    def unavailable_reason(self) -> str | None:
        return None

    def space(self, workload: Any, problem: Mapping[str, int], dtype: str) -> SearchSpace:
        return SearchSpace({"variant": tuple(range(10_000))})

    def build(self, workload: Any, problem: Mapping[str, int], dtype: str,
              config: Mapping[str, Any]) -> Runnable:  # fmt: skip
        return workload.torch_fn

    def summarize(self, config: Mapping[str, Any]) -> str:
        return f"variant {config.get('variant')}"


class TrivialFarmed(Trivial):
    """:class:`Trivial` compiled "ahead" in the compile farm, instantly."""

    def compile_target(self) -> Target | None:
        from backends.triton import DeviceLimits

        return Target("cuda", "sm_90", DeviceLimits.H100)

    def compile_ahead(self, workload: Any, problem: Mapping[str, int], dtype: str,
                      config: Mapping[str, Any], target: Target) -> dict[str, int]:  # fmt: skip
        return {"kernels": 1, "shared": 0}


def _task(backend: str, workload: str, problem: dict[str, int], timer: Any,
          target: Target | None = None) -> Any:  # fmt: skip
    from tuner.harness import Task

    ref = "tunecache.timing:time_cpu"
    return Task(backend=backend, workload=workload, problem=problem, dtype="float32",
                timer=timer, timer_ref=ref, target=target)  # fmt: skip


def harness_overhead(candidates: int, workers: int, farm: bool = False) -> tuple[float, float]:
    """``(ms of overhead per candidate, the slowest candidate's median ms per run)``, through
    the compile farm and the one timing process with ``farm``."""
    from backends import compile_target
    from tunecache.timing import TimerSettings
    from tuner.harness import Harness

    # one warm-up, one sizing call, five timed samples of one call each: at most 7 calls
    timer = TimerSettings(warmup=1, min_repeats=5, max_repeats=5, min_sample_s=0, target_s=0)
    backend = TrivialFarmed() if farm else Trivial()
    ref = f"bench.tuning_throughput:{type(backend).__name__}"
    task = _task(ref, "softmax", {"M": 8, "N": 64}, timer, compile_target(backend))
    configs = [Config.of({"variant": i}) for i in range(candidates)]
    with Harness(workers=workers) as harness:
        bench = harness.benchmarker(task)
        bench.evaluate(configs[:workers])  # set-up and the first round (the farm's start), untimed
        started = time.perf_counter()
        trials = bench.evaluate(configs[workers:])
        wall = time.perf_counter() - started
    # The runs are microseconds (at most 7 per candidate): the wall time per candidate is its
    # overhead, an upper bound that includes them.
    n = len(trials)
    return wall * 1e3 / n, max(t.time_ms or 0.0 for t in trials)


def first_result(backend: str, workload: str, problem: dict[str, int], warm: bool) -> float:
    """Seconds from asking for a new key's first candidate to its measurement."""
    from tunecache.timing import TimerSettings
    from tuner.harness import Harness

    timer = TimerSettings(warmup=1, min_repeats=3, max_repeats=3, target_s=0)
    first = Config.of({"variant": 0})
    if backend == "triton":
        from workloads import get_workload

        first = Config.of(get_workload(workload).default_config("triton", problem, "float32"))
    other = {k: v * 2 for k, v in problem.items()}
    harness = Harness(workers=2) if warm else None
    try:
        if harness is not None:  # serving another key already
            harness.benchmarker(_task(backend, workload, other, timer)).evaluate([first])
        started = time.perf_counter()
        if harness is None:
            harness = Harness(workers=2)
        trials = harness.benchmarker(_task(backend, workload, problem, timer)).evaluate([first])
        seconds = time.perf_counter() - started
    finally:
        if harness is not None:
            harness.close()
    assert trials[0].status == "ok", trials[0]
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tuning_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--configs", type=int, default=16, help="configs compiled per run")
    parser.add_argument("--candidates", type=int, default=64, help="candidates for overhead")
    args = parser.parse_args(argv)
    if args.configs < 2 or args.candidates < 4:
        parser.error("--configs must be at least 2 and --candidates at least 4")
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the harness's Triton runs interpret here
    cores = os.cpu_count() or 1
    configs = gemm_configs(args.configs)
    rows: list[list[Any]] = []
    one = 0.0
    for workers in sorted({1, 2, cores}):
        rate, each = compile_throughput(configs, workers)
        one = one or rate
        rows.append([f"compile for sm_90, {workers} process(es)", f"{rate:.2f} configs/s",
                     f"{rate / one:.2f}x one process; {each:.2f} s per compile"])  # fmt: skip
        print(rows[-1], flush=True)
    farm_one = 0.0
    for workers in sorted({1, 2, cores}):
        compiled = farm_throughput(configs, workers)
        farm_one = farm_one or compiled["rate"]
        rows.append([f"compile for sm_90 in the compile farm, {workers} process(es)",
                     f"{compiled['rate']:.2f} configs/s", f"{compiled['rate'] / farm_one:.2f}x "
                     f"one process; started in {compiled['start']:.2f} s; a process's first "
                     f"compile {compiled['first']:.2f} s, its next ones "
                     f"{compiled['next']:.2f} s"])  # fmt: skip
        print(rows[-1], flush=True)
    for farm in (False, True):
        overhead, timed = harness_overhead(args.candidates, workers=2, farm=farm)
        how = "the compile farm + 1 timing process" if farm else "2 workers"
        rows.append([f"harness overhead per candidate ({how})", f"{overhead:.1f} ms",
                     f"wall per candidate, its runs included (≤ 7 of ≤ {timed:.3f} ms each)"])  # fmt: skip
        print(rows[-1], flush=True)
    for backend, workload, problem in (
        ("bench.tuning_throughput:Trivial", "softmax", {"M": 8, "N": 64}),
        ("triton", "matmul", {"M": 64, "N": 64, "K": 64}),
    ):
        for warm in (False, True):
            seconds = first_result(backend, workload, problem, warm)
            name = "trivial" if backend.endswith("Trivial") else "triton matmul (interpreter)"
            rows.append([f"first result, {'warm' if warm else 'cold'} harness, {name}",
                         f"{seconds:.2f} s", "a new key: set-up, build, check, time"])  # fmt: skip
            print(rows[-1], flush=True)
    table = render(["measure", "value", "note"], rows)
    notes = [
        f"the matmul kernel's configs at {SHAPE} bf16, {len(configs) - 1} timed compiles per "
        "run (a first compile per process warms imports, untimed)",
        "the harness's timer here: perf_counter (CPU), five timed calls per candidate",
        "the compile farm's rows compile through the kernel's launch in compile-only mode (M, N, "
        "K and strides specialised as a launch does, answers over pipes); the rows above it call "
        "triton.compile with every integer unspecialised",
    ]
    write_result("tuning_throughput", "Tuning throughput (compile, harness, first result)",
                 notes, table)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
