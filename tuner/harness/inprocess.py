"""The in-process benchmarker: the same checks and timings as the harness, in this process.

For kernels that cannot take the process down, and for tests of the pipeline around measurement;
a segfault or a hang here takes the caller with it, which is what the harness is for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tunecache.schemas import Trial, ValidationReport
from tunecache.space import Config
from tuner.harness.measurer import Measurer
from tuner.harness.task import Task
from tuner.measure import Benchmarker, Measurement


class InProcessBenchmarker(Benchmarker):
    """Builds, checks and times the candidates of ``task`` here, one at a time."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.measurer = Measurer(task)

    @property
    def parallelism(self) -> int:
        return 1

    def measure(self, config: Mapping[str, Any] | None, *, again: bool = False) -> Measurement:
        return self.measurer.measure(config, again=again)

    def validate(self, config: Mapping[str, Any], seeds: Sequence[int]) -> ValidationReport:
        return self.measurer.validate(config, seeds)

    def seconds_per_check(self) -> float:
        return self.measurer.check_s

    def evaluate(self, configs: list[Config]) -> list[Trial]:
        trials = []
        for config in configs:
            measured = self.measurer.try_build(config) or self.measure(config)
            trials.append(measured.trial(config))
        return trials
