"""Wire schemas of measurements: a timing, the machine's conditions over it, and a speedup
over a baseline from an interleaved comparison (:mod:`tunecache.interleave`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictBool, model_validator

from tunecache.conditions import THROTTLE_REASONS
from tunecache.strict import INTEGRAL, Line, Millis, Strict

Mhz = Annotated[float, Field(strict=True, ge=0, lt=1e6, allow_inf_nan=False)]
# Shown on terminals as they are: one line of printable text (no escape sequences).
NoiseReason = Annotated[Line, Field(min_length=1, max_length=120)]
Throttle = Literal[THROTTLE_REASONS]  # type: ignore[valid-type]
Cores = Annotated[float, Field(strict=True, ge=0, lt=1e5, allow_inf_nan=False)]
MAX_NOISE_REASONS = 8


class ConditionsModel(Strict):
    """The machine's conditions over a timing (:mod:`tunecache.conditions`), and why it is
    noisy (``noise``: empty when it is not)."""

    # Cores other processes used on average while it ran (None: not readable there).
    others_cpu: Cores | None = None
    cpu_mhz_before: Mhz | None = None
    cpu_mhz_after: Mhz | None = None
    gpu_mhz_before: Mhz | None = None
    gpu_mhz_after: Mhz | None = None
    throttle: Annotated[list[Throttle], Field(max_length=len(THROTTLE_REASONS))] = []
    gpu_others: Annotated[int, Field(strict=True, ge=0, le=100_000), INTEGRAL] | None = None
    # Samples left out as disturbed (the process was preempted while they ran).
    left_out: Annotated[int, Field(strict=True, ge=0, le=1_000_000_000), INTEGRAL] = 0
    # How many times it was timed (a noisy timing is timed again, up to a bound).
    attempts: Annotated[int, Field(strict=True, ge=1, le=100), INTEGRAL] = 1
    noise: Annotated[list[NoiseReason], Field(max_length=MAX_NOISE_REASONS)] = []


INTERPRETER_TIMER = "host clock, Triton's interpreter (not a GPU's time)"  # fits TimingModel.timer


class TimingModel(Strict):
    """A timing: median of ``repeats`` runs after ``warmup`` runs, with its spread.

    ``noisy``: the machine disturbed it past the thresholds of :mod:`tunecache.conditions` even
    after timing it again; ``conditions`` says how (and is there whenever ``noisy`` is).
    """

    median_ms: Millis
    min_ms: Millis
    max_ms: Millis
    iqr_ms: Annotated[float, Field(strict=True, ge=0, lt=1e9, allow_inf_nan=False)] = 0.0
    # Up to max_repeats samples of up to 1e6 batched calls each (tunecache.timing).
    repeats: Annotated[int, Field(strict=True, ge=1, le=1_000_000_000), INTEGRAL]
    warmup: Annotated[int, Field(strict=True, ge=0, le=1_000_000), INTEGRAL] = 0
    timer: Annotated[Line, Field(max_length=64)] = "perf_counter"
    noisy: StrictBool = False
    conditions: ConditionsModel | None = None

    @model_validator(mode="after")
    def _ordered(self) -> TimingModel:
        if not self.min_ms <= self.median_ms <= self.max_ms:
            raise ValueError("timing must satisfy min_ms <= median_ms <= max_ms")
        if self.noisy != bool(self.conditions is not None and self.conditions.noise):
            raise ValueError("a timing is noisy exactly when its conditions name the noise")
        return self

    @property
    def interpreted(self) -> bool:
        """Whether Triton's interpreter ran it on the host (:data:`INTERPRETER_TIMER`): a time
        that says nothing of a GPU's, shown marked as such."""
        return self.timer == INTERPRETER_TIMER

    @property
    def spread(self) -> float:
        """The inter-quartile range over the median."""
        return self.iqr_ms / self.median_ms if self.median_ms > 0 else 0.0


SAME_BELOW = 0.995  # a ratio without an interval from here to 1/SAME_BELOW reads "the same"
# A ratio of two times: positive, finite, within what any two timings can differ by.
TimeRatio = Annotated[float, Field(strict=True, gt=0, lt=1e12, allow_inf_nan=False)]


class Speedup(Strict):
    """How many times faster the winner ran than a baseline, timed in alternating rounds in one
    window (:mod:`tunecache.interleave`): the median of the per-round ratios (baseline / winner) and
    its distribution-free 95 % interval. An interval holding 1 is "the same within noise"."""

    median: TimeRatio
    low: TimeRatio
    high: TimeRatio
    rounds: Annotated[int, Field(strict=True, ge=1, le=10_000), INTEGRAL]

    @model_validator(mode="after")
    def _ordered(self) -> Speedup:
        if not self.low <= self.median <= self.high:
            raise ValueError("a speedup must satisfy low <= median <= high")
        return self


class BaselineModel(Strict):
    name: Annotated[Line, Field(max_length=64)]  # "torch_eager", "default_config", "cublas"
    timing: TimingModel
    # From the interleaved final comparison; None in records tuned before it existed.
    speedup: Speedup | None = None
