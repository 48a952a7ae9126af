"""The measurement harness: isolated worker processes that build, check and time candidates of
any number of keys, and the in-process benchmarker behind the same interface."""

from __future__ import annotations

from tuner.harness.inprocess import InProcessBenchmarker
from tuner.harness.pool import Harness, HarnessBenchmarker
from tuner.harness.task import Task, resolve_backend

__all__ = ["Harness", "HarnessBenchmarker", "InProcessBenchmarker", "Task", "resolve_backend"]
