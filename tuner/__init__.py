"""The tuner: search, validate against the golden reference, time, and build the record."""

from __future__ import annotations

from tuner.tune import TuneOptions, TuneOutcome, check_local, tune

__all__ = ["TuneOptions", "TuneOutcome", "check_local", "tune"]
