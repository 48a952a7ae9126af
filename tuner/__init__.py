"""The tuner: search, validate against the golden reference, time, and build the record."""

from __future__ import annotations

from tuner.tune import TuneOutcome, tune

__all__ = ["TuneOutcome", "tune"]
