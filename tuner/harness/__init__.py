"""The measurement harness: isolated worker processes that build, check and time candidates."""

from __future__ import annotations

from tuner.harness.job import Job, resolve_backend
from tuner.harness.pool import Harness

__all__ = ["Harness", "Job", "resolve_backend"]
