"""Wire schemas of measurements: a timing, the machine's conditions over it, and a speedup
over a baseline from an interleaved comparison (:mod:`tunecache.interleave`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, ValidationInfo, model_validator

from tunecache.conditions import THROTTLE_REASONS, Reading, noise
from tunecache.strict import INTEGRAL, SERVED, STORED, UNSIGNED, Line, Millis, Strict

Mhz = Annotated[float, Field(strict=True, ge=0, lt=1e6, allow_inf_nan=False), UNSIGNED]
# Shown on terminals as they are: one line of printable text (no escape sequences).
NoiseReason = Annotated[Line, Field(min_length=1, max_length=120)]
Throttle = Literal[THROTTLE_REASONS]  # type: ignore[valid-type]
Cores = Annotated[float, Field(strict=True, ge=0, lt=1e5, allow_inf_nan=False), UNSIGNED]
MAX_NOISE_REASONS = 8


def uploaded(info: ValidationInfo) -> bool:
    """Whether the figures are checked for agreeing with each other: as uploaded (or built), not
    as a server reads back what it stored nor as a client reads a server's answer. A record stored
    before the checks stays readable: a listing is parsed whole, and one such record would fail
    every ``best``, ``report`` and ``records list`` of the team (a server in the middle can
    show consistent made-up figures anyway: ``docs/security.md``)."""
    return info.context is not STORED and info.context is not SERVED


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
# Timers whose one repeat sums up many runs, its min and max their quantiles: Triton's do_bench
# (median, p20, p80: tunecache.triton.record.DO_BENCH_TIMER) and the interpreter's host bench.
SUMMING_TIMERS = frozenset({"triton do_bench (median, p20, p80)", INTERPRETER_TIMER})
# The widest iqr over max - min of any samples: Python's (exclusive) quartiles of two samples
# reach past them, 1.5x their range (tunecache.timing); of three or more they stay within.
IQR_REACH = 1.5
ROUNDING = 1e-9  # relative: figures computed two ways (a quartile, a ratio) differ by rounding


class TimingModel(Strict):
    """A timing: median of ``repeats`` runs after ``warmup`` runs, with its spread.

    ``noisy``: the machine disturbed it past the thresholds of :mod:`tunecache.conditions` even
    after timing it again; ``conditions`` says how (and is there whenever ``noisy`` is).
    """

    median_ms: Millis
    min_ms: Millis
    max_ms: Millis
    iqr_ms: Annotated[float, Field(strict=True, ge=0, lt=1e9, allow_inf_nan=False), UNSIGNED] = 0.0
    # Up to max_repeats samples of up to 1e6 batched calls each (tunecache.timing).
    repeats: Annotated[int, Field(strict=True, ge=1, le=1_000_000_000), INTEGRAL]
    warmup: Annotated[int, Field(strict=True, ge=0, le=1_000_000), INTEGRAL] = 0
    timer: Annotated[Line, Field(max_length=64)] = "perf_counter"
    noisy: StrictBool = False
    conditions: ConditionsModel | None = None

    @model_validator(mode="after")
    def _ordered(self, info: ValidationInfo) -> TimingModel:
        if not self.min_ms <= self.median_ms <= self.max_ms:
            raise ValueError("timing must satisfy min_ms <= median_ms <= max_ms")
        if self.noisy != bool(self.conditions is not None and self.conditions.noise):
            raise ValueError("a timing is noisy exactly when its conditions name the noise")
        if uploaded(info) and (why := self._spread_problem()):
            raise ValueError(why)
        return self

    def _spread_problem(self) -> str | None:
        """What no set of samples gives: a spread of one sample (``repeats`` counts calls, each
        sample one or more; a summing timer's one repeat excepted), an iqr wider than
        :data:`IQR_REACH` times the range. An audit uploaded ``repeats: 1`` with min 0.5, max 2
        and an iqr of 0.1 ms, shown as given."""
        spread = self.max_ms - self.min_ms
        if self.repeats == 1 and self.timer not in SUMMING_TIMERS and (spread or self.iqr_ms):
            return (f"repeats is 1 (one sample) but min_ms {self.min_ms:g}, max_ms {self.max_ms:g}"
                    f", iqr_ms {self.iqr_ms:g}: one sample has min_ms == median_ms == max_ms "
                    f"and iqr_ms 0")  # fmt: skip
        if self.iqr_ms > IQR_REACH * spread * (1 + ROUNDING) + 1e-12:
            return (f"iqr_ms {self.iqr_ms:g} is over {IQR_REACH:g} x (max_ms - min_ms) = "
                    f"{IQR_REACH * spread:g}: no samples have quartiles so far apart")  # fmt: skip
        return None

    def figures_noise(self, cuda: bool) -> list[str]:
        """Why its own figures say it is noisy (:func:`tunecache.conditions.noise` of its spread
        and conditions, timed on a GPU if ``cuda``), whatever ``noisy`` says: an audit uploaded
        ``noisy: false`` beside other processes at 1.99 cores and a spread of 33 %, shown as a
        quiet timing. What is not kept (the share of samples disturbed, another process's turn
        at the device) only its ``conditions.noise`` can say."""
        c = self.conditions
        reading = None if c is None else Reading(
            c.others_cpu, _pair(c.cpu_mhz_before, c.cpu_mhz_after),
            _pair(c.gpu_mhz_before, c.gpu_mhz_after), tuple(c.throttle), c.gpu_others)  # fmt: skip
        return noise(reading, spread=self.spread, disturbed=0.0, cuda=cuda)

    @property
    def interpreted(self) -> bool:
        """Whether Triton's interpreter ran it on the host (:data:`INTERPRETER_TIMER`): a time
        that says nothing of a GPU's, shown marked as such."""
        return self.timer == INTERPRETER_TIMER

    @property
    def spread(self) -> float:
        """The inter-quartile range over the median."""
        return self.iqr_ms / self.median_ms if self.median_ms > 0 else 0.0


def _pair(before: float | None, after: float | None) -> tuple[float, float] | None:
    """Two clocks as stored, rounded to the MHz: each half a MHz toward the other, so that no
    change is read past a threshold the clocks themselves were not (1000.49 to 1100.53 MHz is
    no 10 % change; stored, 1000 to 1101 was)."""
    if before is None or after is None:
        return None
    step = min(0.5, abs(after - before) / 2)
    return (before + step, after - step) if after > before else (before - step, after + step)


# A speedup's interval reaches at least this far either side of its median, one round's too:
# tunecache.interleave.REPRODUCIBLE (which imports this module's users; a test pins the two).
ONE_ROUND_REACH = 0.01
SAME_BELOW = 0.995  # a ratio without an interval from here to 1/SAME_BELOW reads "the same"
# A ratio of two times: positive, finite, within what any two timings can differ by.
TimeRatio = Annotated[float, Field(strict=True, gt=0, lt=1e12, allow_inf_nan=False)]


class Speedup(Strict):
    """How many times faster the winner ran than a baseline, timed in alternating rounds in one
    window (:mod:`tunecache.interleave`): the median of the per-round ratios (baseline / winner) and
    its distribution-free interval (95 %, or of fewer rounds their whole range:
    :func:`tunecache.believed.coverage`). An interval holding 1 is "the same within noise"."""

    median: TimeRatio
    low: TimeRatio
    high: TimeRatio
    rounds: Annotated[int, Field(strict=True, ge=1, le=10_000), INTEGRAL]

    @model_validator(mode="after")
    def _ordered(self, info: ValidationInfo) -> Speedup:
        if not self.low <= self.median <= self.high:
            raise ValueError("a speedup must satisfy low <= median <= high")
        if uploaded(info) and self.rounds == 1 and not self._one_ratio():
            raise ValueError(f"a speedup of one round has one ratio: low {self.low:g} and high "
                             f"{self.high:g} must be within {ONE_ROUND_REACH:.0%} of its median "
                             f"{self.median:g}")  # fmt: skip
        return self

    def _one_ratio(self) -> bool:
        """Whether the interval is one ratio's: the median, widened by the reproducibility floor
        (``low`` = median / 1.01, ``high`` = median x 1.01), or not at all (before the floor)."""
        reach = 1 + ONE_ROUND_REACH
        return (self.low * reach >= self.median * (1 - ROUNDING)
                and self.high <= self.median * reach * (1 + ROUNDING))  # fmt: skip


class BaselineModel(Strict):
    name: Annotated[Line, Field(max_length=64)]  # "torch_eager", "default_config", "cublas"
    timing: TimingModel
    # From the interleaved final comparison; None in records tuned before it existed.
    speedup: Speedup | None = None

    @staticmethod
    def agreeing(baselines: list[BaselineModel], info: ValidationInfo) -> list[BaselineModel]:
        """``baselines`` (a record's, as a validator) if each speedup agrees with its timing and
        the winner's (``timing``, validated before them): :func:`speedup_problem`."""
        winner = info.data.get("timing")
        if not uploaded(info) or not isinstance(winner, TimingModel):
            return baselines
        for i, baseline in enumerate(baselines):
            if baseline.speedup is not None and (why := speedup_problem(baseline, winner)):
                raise ValueError(f"baselines[{i}] ({baseline.name}): {why}")
        return baselines


# How far a speedup may lie outside [baseline min / winner max, baseline max / winner min]
# (speedup_problem), either way. Measured: all 17 real comparisons here (TVM and Inductor tunes
# on a busy 2-core Intel Xeon, the tuner's tests) kept the median inside the bare bound, by
# 1.025x at the least (5-sample timings: narrow spreads); stand-in timers with no spread
# (min = max, the rounds' drift all outside it) read up to 1.22x past it. The audit's claim was
# 1000x past.
SPEEDUP_SLACK = 2.0


def speedup_problem(baseline: BaselineModel, winner: TimingModel) -> str | None:
    """Why ``baseline``'s speedup cannot come from its timing and the winner's, if it cannot.

    tuner.select times the winner and the baselines once each per round (a timing of many
    samples, its median the round's time), alternating; the speedup is the median of the
    undisturbed rounds' ratios (baseline / winner), and the record keeps each one's timing of
    its median round among the same rounds. The ratio spans rounds, a timing's min and max only
    its own round: the bound is [baseline min / winner max, baseline max / winner min] widened
    by :data:`SPEEDUP_SLACK` either way for the rounds' drift."""
    assert baseline.speedup is not None
    timing, median = baseline.timing, baseline.speedup.median
    low = timing.min_ms / winner.max_ms / SPEEDUP_SLACK
    high = timing.max_ms / winner.min_ms * SPEEDUP_SLACK
    if not low <= median <= high:
        return (f"speedup median {median:g} is outside {low:.3g}-{high:.3g}, what its timing "
                f"({timing.min_ms:g}-{timing.max_ms:g} ms) and the winner's ({winner.min_ms:g}-"
                f"{winner.max_ms:g} ms) allow, {SPEEDUP_SLACK:g}x either way for the rounds' "
                "drift")  # fmt: skip
    # Its median round over the winner's, the times shown beside it: wide spreads let an audit's
    # 19x sit inside the bound above beside medians of 0.5 ms over 1.0 ms (0.5x).
    medians = timing.median_ms / winner.median_ms
    if medians / SPEEDUP_SLACK <= median <= medians * SPEEDUP_SLACK:
        return None
    return (
        f"speedup median {median:g} is more than {SPEEDUP_SLACK:g}x from {medians:.3g}, its "
        f"median time ({timing.median_ms:g} ms) over the winner's ({winner.median_ms:g} ms)"
    )


# Fields a record's timings and trials gained after the first servers: at their defaults
# (``None``, ``False``, empty) an upload leaves them out, and a server that predates them takes
# it (they refused the whole upload: 422 on ``timing.noisy: false``). Every other field is sent
# as it is (a key's schema, a timing's timer: their meaning must not ride on a default).
LATE_TIMING_FIELDS = ("noisy", "conditions")
LATE_TRIAL_FIELDS = ("times_ms",)
LATE_BASELINE_FIELDS = ("speedup",)


def without_late_defaults(record: dict[str, Any]) -> dict[str, Any]:
    """A record's JSON (``RecordCreate``'s) without the late fields at their defaults."""

    def lean(item: Any, names: tuple[str, ...]) -> Any:
        if not isinstance(item, dict):
            return item
        return {k: v for k, v in item.items()
                if not (k in names and (v is None or v is False or v == []))}  # fmt: skip

    body = dict(record)
    body["timing"] = lean(body.get("timing"), LATE_TIMING_FIELDS)
    body["trials"] = [lean(t, LATE_TRIAL_FIELDS) for t in body.get("trials") or []]
    body["baselines"] = [
        {**lean(b, LATE_BASELINE_FIELDS), "timing": lean(b.get("timing"), LATE_TIMING_FIELDS)}
        if isinstance(b, dict)
        else b
        for b in body.get("baselines") or []
    ]
    return body
