"""A MetaSchedule runner that times candidates in the builder's warm worker pool.

Like ``LocalRunner`` it runs one candidate at a time (MetaSchedule builds a whole batch before it
measures it, so the workers are idle then) with TVM's ``time_evaluator`` on random inputs, each
in the cores' turn with other processes' timings (:mod:`tunecache.devicelock`). Of a
candidate's repeats, only the quickest quarter reaches MetaSchedule (:func:`quickest`): load on
the machine only ever adds time, and a mean over repeats that another process interrupted ranks
the moment as much as the candidate.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from backends.tvm.builder import SKIPPED
from tunecache.devicelock import timing_on

if TYPE_CHECKING:
    from backends.tvm.builder import WarmPool


def quickest(costs: list[float]) -> list[float]:
    """The quickest quarter of a candidate's repeated timings (one at least), quickest first.

    Example:
        >>> quickest([3.0, 1.0, 9.0, 2.0, 1.5, 8.0, 1.2, 7.0])
        [1.0, 1.2]
    """
    return sorted(costs)[: max(1, len(costs) // 4)]


def make_runner(pool: WarmPool, *, repeat: int, min_repeat_ms: int) -> Any:
    """A MetaSchedule ``Runner``: each candidate timed ``repeat`` times, ≥ ``min_repeat_ms``."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, PyRunner
    from tvm.s_tir.meta_schedule.runner.local_runner import LocalRunnerFuture, _worker_func

    config = EvaluatorConfig(
        number=1, repeat=repeat, min_repeat_ms=min_repeat_ms, enable_cpu_cache_flush=False
    )

    @derived_object
    class WarmRunner(PyRunner):
        def run(self, runner_inputs: list[Any]) -> list[Any]:
            futures = []
            for item in runner_inputs:
                if pool.out_of_time():  # the rest of the batch is skipped, not measured
                    futures.append(LocalRunnerFuture(res=None, error_message=SKIPPED))
                    continue
                args_info = tuple(info.as_json() for info in item.args_info)
                began = time.monotonic()
                try:
                    with timing_on("cpu"):  # the cores' turn (tunecache.devicelock)
                        costs = pool.pool.submit(
                            _worker_func, None, None, None, config, 1,
                            str(item.artifact_path), str(item.device_type), args_info,
                        ).result()  # fmt: skip
                except TimeoutError:
                    message = f"run timed out after {pool.timeout_sec:g} s"
                    futures.append(LocalRunnerFuture(res=None, error_message=message))
                except Exception as exc:
                    futures.append(LocalRunnerFuture(res=None, error_message=f"run failed: {exc}"))
                else:
                    pool.measured += 1
                    pool.measure_s.append(time.monotonic() - began)
                    futures.append(LocalRunnerFuture(res=quickest(costs), error_message=None))
            pool.round_done()  # MetaSchedule's callbacks (its cost model's update), then a round
            return futures

    return WarmRunner()
