"""The compile farm: candidates compile in CPU-only processes ahead of the one process that times.

Two halves:

* **Triton for real** (its compiler, no interpreter, no GPU): the farm compiles configs for
  ``sm_90`` into Triton's cache; a later launch of the same configs in another process (as far as
  a launch goes without a GPU: ``JITFunction.run`` up to the compiled kernel) finds them there and
  compiles nothing. A compiled kernel over the target's shared memory is recorded ``invalid``,
  never launched.
* **The harness's pipeline**, with Triton's kernels in the interpreter and a backend whose
  compiles are slow and counted (a compile "ahead" leaves a marker file that the timing process's
  build finds): tuning a key through the farm compiles nothing in the timing process; the same tune
  without the farm compiles every candidate there; and the search hands the farm its next batch
  before the current one is timed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from backends import Budget, Target
from backends.triton import TritonBackend
from tests.test_triton_kernels import interpreter_without_gpu, launchable  # noqa: F401
from tunecache import key_for
from tunecache.canonical import digest
from tunecache.device import DeviceLimits
from tunecache.schemas import Trial
from tunecache.space import Config, SearchSpace
from tunecache.timing import TimerSettings
from tuner import TuneOptions, tune
from tuner.harness import Harness, Task
from tuner.harness.farm import CompileFarm
from tuner.measure import Pipelines
from tuner.search import get_strategy, run_search

REPO = Path(__file__).resolve().parents[1]
SM_90 = Target("cuda", "sm_90", DeviceLimits.H100)
GEMM = {"M": 16, "N": 4096, "K": 4096}
QUICK = TimerSettings(warmup=1, min_repeats=3, max_repeats=5, target_s=0.01)


# -- Triton for real ------------------------------------------------------------------------


def launch_in_a_new_process(cache: Path, configs: list[dict[str, Any]]) -> dict[str, int]:
    """Compiles and counts as the timing process's first launches would (no GPU: the launch
    stops at the compiled kernel), with Triton's cache at ``cache``."""
    script = textwrap.dedent(f"""
        import json
        from backends.base import Target
        from backends.triton.ahead import compile_for, compiles
        from tunecache.device import DeviceLimits
        from tunecache.space import Config
        from workloads import get_workload

        target = Target("cuda", "sm_90", DeviceLimits.H100)
        for config in {configs!r}:
            compile_for(get_workload("matmul"), {GEMM!r}, "bfloat16", Config.from_json(config),
                        target)
        print(json.dumps(compiles()))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**env, "TRITON_CACHE_DIR": str(cache)}, timeout=300,
                          cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    counts: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return counts


def test_a_users_plain_triton_jit_kernel_compiles_ahead(tmp_path: Path) -> None:
    """A user's kernel launches a plain ``@triton.jit`` function from its own code (no
    ``lazy_jit``): the farm's compile-only launch still compiles it for sm_90 and launches
    nothing (it used to fail on the target driver's missing launcher)."""
    script = textwrap.dedent("""
        import json
        from backends.base import Target
        from backends.triton.ahead import compile_for
        from tests.user_kernels import AffineRows
        from tunecache.device import DeviceLimits
        from tunecache.space import Config

        target = Target("cuda", "sm_90", DeviceLimits.H100)
        config = Config.of({"BLOCK": 32, "num_warps": 1})
        print(json.dumps(compile_for(AffineRows(), {"M": 8, "N": 24}, "float32", config, target)))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**env, "TRITON_CACHE_DIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": "",
                               "PYTHONPATH": str(REPO)}, timeout=300, cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["kernels"] == 1


@pytest.fixture
def triton_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh Triton cache directory for this test's processes (farm processes inherit it)."""
    cache = tmp_path / "triton-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    return cache


def test_a_farm_compiled_config_is_launched_without_a_compile(
    triton_cache: Path, tmp_path: Path
) -> None:
    default = TritonBackend().space(get_matmul(), GEMM, "bfloat16", DeviceLimits.H100)
    configs = [
        c.to_json() for c in default.configs() if c["BLOCK_M"] == 16 and c["num_warps"] == 4
    ][:1]
    split = {**configs[0], "SPLIT_K": 4}  # two kernels: the K-slices and their reduction
    configs.append(split)
    task = Task(backend="triton", workload="matmul", problem=GEMM, dtype="bfloat16",
                device="cuda", target=SM_90)  # fmt: skip
    farm = CompileFarm(workers=2, timeout=300, start_timeout=180)
    try:
        answers = list(farm.compile_all(task, configs).values())
    finally:
        farm.close()
    assert [a.status for a in answers] == ["ok", "ok"], answers
    assert all(0 < a.facts["shared"] <= SM_90.limits.max_shared_memory_per_block for a in answers)
    kernels = sum(a.facts["kernels"] for a in answers)
    assert kernels == 3
    assert launch_in_a_new_process(triton_cache, configs) == {"compiled": 0, "cache_hits": 3}
    # The same launches with an empty cache compile: the count above can fail.
    cold = launch_in_a_new_process(tmp_path / "cold-cache", configs)
    assert cold == {"compiled": 3, "cache_hits": 0}


def test_a_kernel_over_the_targets_shared_memory_is_invalid_without_a_launch(
    triton_cache: Path,
) -> None:
    # A one-tile softmax row over 4 warps keeps its reductions' scratch (a word per warp) in
    # shared memory, which no formula prunes: a target allowing 8 bytes per block is exceeded.
    tiny = DeviceLimits("8-byte GPU", 8, 1024, 132)
    problem = {"M": 64, "N": 1024}
    config = {"BLOCK_N": 1024, "ROWS_PER_PROGRAM": 1, "num_warps": 4, "num_stages": 1}
    task = Task(backend="triton", workload="softmax", problem=problem, dtype="float16",
                device="cuda", target=Target("cuda", "sm_90", tiny))  # fmt: skip
    farm = CompileFarm(workers=1, timeout=300, start_timeout=180)
    try:
        [answer] = farm.compile_all(task, [config]).values()
        [fits] = farm.compile_all(Task(**{**task.__dict__, "target": SM_90}), [config]).values()
    finally:
        farm.close()
    assert answer.status == "invalid", answer
    assert "bytes of shared memory; sm_90 allows 8 per block" in answer.error
    assert fits.status == "ok" and fits.facts["shared"] > 8


def test_a_cancelled_task_leaves_nothing_behind_in_the_farm() -> None:
    from tunecache.canonical import canonical_json

    task = Task(backend="bench.tuning_throughput:TrivialFarmed", workload="softmax",
                problem={"M": 8, "N": 64}, dtype="float32", target=SM_90)  # fmt: skip
    configs = [{"variant": i} for i in range(4)]
    labels = [canonical_json(c) for c in configs]
    farm = CompileFarm(workers=1, timeout=60, start_timeout=180)
    try:
        farm.submit(task, configs[:2])
        farm.wait()  # one answered; the other running or done
        farm.submit(task, configs[2:])  # queued
        farm.cancel(task)
        while farm.busy():  # what was running finishes, unclaimed
            farm.wait()
        assert farm.arrived(task, labels) is None
        [answer] = farm.compile_all(task, configs[:1]).values()  # compiled again on demand
    finally:
        farm.close()
    assert answer.status == "ok"


def get_matmul() -> Any:
    from workloads import get_workload

    return get_workload("matmul")


# -- the harness's pipeline -----------------------------------------------------------------

MARKS = "TUNECACHE_TEST_FARM_MARKS"
COMPILE_S = 0.1
PROBLEM = {"M": 16, "N": 32, "K": 32}
_compiled = 0  # this process's compiles (the worker that times reports them)


class FarmedTriton(TritonBackend):
    """Triton whose every config takes a slow compile, once per machine: a compile, ahead or
    in ``build``, leaves a marker file (in ``$TUNECACHE_TEST_FARM_MARKS``) that later builds
    load instead. Its kernels run in the interpreter, where the timing process runs."""

    def compile_target(self) -> Target | None:
        return SM_90

    def _mark(self, workload: Any, problem: Mapping[str, int], dtype: str,
              config: Mapping[str, Any]) -> Path:  # fmt: skip
        chosen = self.space(workload, problem, dtype).complete(Config.from_json(config))
        name = digest({"kernel": workload.name, "problem": dict(problem), "dtype": dtype,
                       "config": chosen.to_json()})  # fmt: skip
        return Path(os.environ[MARKS]) / name

    def compile_ahead(self, workload: Any, problem: Mapping[str, int], dtype: str,
                      config: Mapping[str, Any], target: Target) -> dict[str, int]:  # fmt: skip
        time.sleep(COMPILE_S)
        self._mark(workload, problem, dtype, config).write_text(str(os.getpid()))
        return {"kernels": 1, "shared": 0}

    def build(self, workload: Any, problem: Any, dtype: str, config: Any) -> Any:
        global _compiled
        runnable = super().build(workload, problem, dtype, config)
        mark = self._mark(workload, problem, dtype, config)
        if not mark.exists():
            time.sleep(COMPILE_S)
            _compiled += 1
            mark.write_text(str(os.getpid()))
        return runnable

    def compiles(self) -> int | None:
        return _compiled


class CrashingFarmed(FarmedTriton):
    """:class:`FarmedTriton` whose configs with ``BLOCK_M=32`` kill the process that runs them."""

    def build(self, workload: Any, problem: Any, dtype: str, config: Any) -> Any:
        runnable = super().build(workload, problem, dtype, config)
        if int(config["BLOCK_M"]) != 32:
            return runnable
        import signal

        return lambda *inputs, out=None: os.kill(os.getpid(), signal.SIGSEGV)


@pytest.fixture
def marks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty marker directory, known to the workers this test starts."""
    path = tmp_path / "marks"
    path.mkdir()
    monkeypatch.setenv(MARKS, str(path))
    yield path


def farmed_tune(compile_ahead: bool, said: list[str] | None = None) -> Any:
    options = TuneOptions(timer_ref="tunecache.timing:time_cpu", compile_ahead=compile_ahead,
                          backend_ref="tests.test_compile_farm:FarmedTriton",
                          strategy="random")  # fmt: skip
    key = key_for("matmul", "triton", PROBLEM, "float32")
    progress = None if said is None else (lambda p: said.append(p.message))
    with Harness(workers=2) as harness:
        return tune(key, Budget(trials=6), options, harness=harness, backend=FarmedTriton(),
                    progress=progress)  # fmt: skip


@pytest.mark.slow
@pytest.mark.usefixtures("launchable")
def test_a_farm_compiled_candidate_is_timed_with_zero_compiles_in_the_timing_process(
    marks: Path,
) -> None:
    said: list[str] = []
    outcome = farmed_tune(compile_ahead=True, said=said)
    timed = [t for t in outcome.trials if t.status == "ok"]
    assert len(timed) >= 6 and outcome.record.validation.passed
    assert outcome.timer_compiles == 0
    farm = "compiled ahead in the compile farm (2 processes); 0 compiles in the timing process"
    assert any(farm in message for message in said), said
    assert len(list(marks.iterdir())) >= 6  # compiled, all of them, by the farm


@pytest.mark.slow
@pytest.mark.usefixtures("launchable")
def test_without_the_farm_the_timing_processes_compile_every_candidate(marks: Path) -> None:
    outcome = farmed_tune(compile_ahead=False)
    assert outcome.record.validation.passed
    searched = {json.dumps(t.config, sort_keys=True) for t in outcome.trials}
    # every compile left a marker: each one, the validation's edge problem included, counted
    assert outcome.timer_compiles == len(list(marks.iterdir())) > len(searched) >= 6


@pytest.mark.slow
@pytest.mark.usefixtures("launchable", "marks")
def test_a_candidate_that_kills_the_timing_process_fails_alone() -> None:
    task = Task(backend="tests.test_compile_farm:CrashingFarmed", workload="matmul",
                problem=PROBLEM, dtype="float32", timer_ref="tunecache.timing:time_cpu",
                target=SM_90)  # fmt: skip
    space = CrashingFarmed().space(get_matmul(), PROBLEM, "float32")
    fine = [c for c in space.configs() if c["BLOCK_M"] == 16][:2]
    fatal = next(c for c in space.configs() if c["BLOCK_M"] == 32)
    with Harness(workers=2) as harness:
        trials = harness.benchmarker(task).evaluate([fine[0], fatal, fine[1]])
        replaced = harness.replaced
    assert [t.status for t in trials] == ["ok", "runtime_error", "ok"], trials
    assert "SIGSEGV" in trials[1].error
    assert replaced == 1  # the timing process, set up again for the candidate after it


class SlowSetUpFarmed(FarmedTriton):
    """:class:`FarmedTriton` whose set-up takes ``SET_UP_S`` in the timing process (as a CUDA
    context and a large reference do on a GPU); the farm's processes, which construct it for
    every compile, are not slowed (they run without a device and without the interpreter)."""

    SET_UP_S = 8.0

    def __init__(self) -> None:
        in_the_farm = os.environ.get("CUDA_VISIBLE_DEVICES") == "" and (
            "TRITON_INTERPRET" not in os.environ
        )
        if not in_the_farm:
            time.sleep(self.SET_UP_S)


@pytest.mark.slow
@pytest.mark.usefixtures("launchable", "marks")
def test_the_timing_processs_set_up_is_not_taken_for_what_a_batch_costs() -> None:
    # Through the farm, the first batch waits for the timing process's set-up (on a GPU: its
    # device, the inputs and the reference); the batches after it do not. Projected at the first
    # batch's cost (over 8 s), the next one would end past the 15.5 s: the search stopped at 2 trials.
    task = Task(backend="tests.test_compile_farm:SlowSetUpFarmed", workload="matmul",
                problem=PROBLEM, dtype="float32", timer_ref="tunecache.timing:time_cpu",
                target=SM_90, timer=QUICK)  # fmt: skip
    space = FarmedTriton().space(get_matmul(), PROBLEM, "float32")
    with Harness(workers=2) as harness:
        assert harness.farm.workers == 2  # started before the search, as a daemon's is
        bench = harness.benchmarker(task)
        assert isinstance(bench, Pipelines)
        log = run_search(get_strategy("random", space, seed=0), bench.evaluate,
                         Budget(trials=8, seconds=15.5), batch_size=2, prefetch=bench.prefetch,
                         set_up=bench.seconds_setting_up)  # fmt: skip
    assert SlowSetUpFarmed.SET_UP_S <= bench.seconds_setting_up() < log.seconds
    assert (len(log), log.stopped_because) == (8, "trials"), [t.status for _, t in log]
    assert all(t.status == "ok" for _, t in log)


# -- the search's pipeline ------------------------------------------------------------------


def test_the_search_prefetches_its_next_batch_before_the_current_one_is_timed() -> None:
    space = SearchSpace({"BLOCK": (16, 32, 64, 128, 256, 512, 1024)})
    events: list[tuple[str, list[int]]] = []

    def evaluate(configs: list[Config]) -> list[Trial]:
        events.append(("evaluate", [int(c["BLOCK"]) for c in configs]))
        return [Trial(config=c.to_json(), status="ok", time_ms=float(c["BLOCK"])) for c in configs]

    def prefetch(configs: list[Config]) -> None:
        events.append(("prefetch", [int(c["BLOCK"]) for c in configs]))

    log = run_search(get_strategy("exhaustive", space), evaluate, Budget(trials=7),
                     batch_size=2, prefetch=prefetch)  # fmt: skip
    assert events == [
        ("prefetch", [16, 32]), ("prefetch", [64, 128]), ("evaluate", [16, 32]),
        ("prefetch", [256, 512]), ("evaluate", [64, 128]),
        ("prefetch", [1024]), ("evaluate", [256, 512]),
        ("evaluate", [1024]),
    ]  # fmt: skip
    assert log.stopped_because == "trials" and len(log) == 7 and log.best_ms == 16.0


def test_a_batch_prefetched_when_the_search_stops_is_dropped() -> None:
    space = SearchSpace({"BLOCK": tuple(range(1, 41))})
    prefetched: list[list[int]] = []

    def evaluate(configs: list[Config]) -> list[Trial]:
        return [Trial(config=c.to_json(), status="ok", time_ms=1.0) for c in configs]

    log = run_search(
        get_strategy("exhaustive", space),
        evaluate,
        Budget(trials=40, patience=4),
        batch_size=2,
        prefetch=lambda cs: prefetched.append([int(c["BLOCK"]) for c in cs]),
    )
    assert log.stopped_because == "patience" and len(log) == 6
    assert prefetched[-1] == [] and prefetched[-2] == [7, 8]  # asked, never evaluated


def test_a_batch_prefetched_when_the_progress_callback_stops_the_search_is_dropped() -> None:
    """A cancelled job's daemon stops its tune from the progress callback: before, the batch
    compiling ahead stayed in the farm's queue, ahead of the next job's first batch."""
    space = SearchSpace({"BLOCK": tuple(range(1, 41))})
    prefetched: list[list[int]] = []

    def evaluate(configs: list[Config]) -> list[Trial]:
        return [Trial(config=c.to_json(), status="ok", time_ms=1.0) for c in configs]

    def cancelled(_: object) -> None:
        raise RuntimeError("cancelled")

    with pytest.raises(RuntimeError, match="cancelled"):
        run_search(get_strategy("exhaustive", space), evaluate, Budget(trials=40), batch_size=2,
                   progress=cancelled,
                   prefetch=lambda cs: prefetched.append([int(c["BLOCK"]) for c in cs]))  # fmt: skip
    assert prefetched == [[1, 2], [3, 4], []]  # the batch after the first, taken back


# -- out of resources at load ---------------------------------------------------------------


class LoadFails(TritonBackend):
    """Triton whose every kernel fails as it loads: with Triton's ``OutOfResources`` (how a
    GPU reports a kernel whose registers leave too few threads per block) for a config of 4
    warps, with any other error for the rest."""

    def build(self, workload: Any, problem: Any, dtype: str, config: Any) -> Any:
        from triton.runtime.errors import OutOfResources

        warps = int(config["num_warps"])

        def launch(*inputs: Any, out: Any = None) -> Any:
            if warps == 4:
                raise OutOfResources(warps * 32, 96, "threads")
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        return launch


def test_a_kernel_out_of_resources_at_load_is_invalid_not_a_runtime_error() -> None:
    from tuner.harness import InProcessBenchmarker

    task = Task(backend="tests.test_compile_farm:LoadFails", workload="softmax",
                problem={"M": 8, "N": 64}, dtype="float32",
                timer_ref="tunecache.timing:time_cpu")  # fmt: skip
    base = {"BLOCK_N": 64, "ROWS_PER_PROGRAM": 1, "num_stages": 1}
    trials = InProcessBenchmarker(task).evaluate(
        [Config.from_json({**base, "num_warps": 4}), Config.from_json({**base, "num_warps": 2})]
    )
    assert [t.status for t in trials] == ["invalid", "runtime_error"]
    assert "out of resource: threads, Required: 128, Hardware limit: 96" in trials[0].error
    assert "never launched" in trials[0].error
