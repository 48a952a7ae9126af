"""A record's figures agree with each other: what no honest measurement produces is a 422 at
upload naming the field (an audit's write token uploaded a winner of 1 ms "1000x faster" than a
torch eager timed at 1 ms, and every display showed it as given); what the product itself
produces (a real tune, Triton's do_bench timings, a comparison of one round) is accepted, and
records stored before the checks are read back as they are."""

from __future__ import annotations

import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from backends import Budget
from tests.conftest import LiveServer
from tests.factories import AUTH, make_key, make_record
from tunecache import key_for
from tunecache.interleave import ratio
from tunecache.schemas import SERVED, STORED, RecordPublic, Speedup, TimingModel
from tunecache.timing import TimerSettings, time_cpu
from tunecache.triton.record import timing_of
from tuner import TuneOptions, tune


def timing(median: float, low: float | None = None, high: float | None = None,
           iqr: float | None = None, repeats: int = 50) -> dict[str, Any]:  # fmt: skip
    return {"median_ms": median, "min_ms": median * 0.98 if low is None else low,
            "max_ms": median * 1.05 if high is None else high,
            "iqr_ms": median * 0.01 if iqr is None else iqr, "repeats": repeats}  # fmt: skip


def body(winner: dict[str, Any], *baselines: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = make_record(make_key(m=64)).model_dump(mode="json", by_alias=True)
    return {**record, "timing": winner, "baselines": list(baselines)}


def eager(ms: float, median: float, low: float, high: float, rounds: int = 5,
          name: str = "torch_eager") -> dict[str, Any]:  # fmt: skip
    ratio_ = {"median": median, "low": low, "high": high, "rounds": rounds}
    return {"name": name, "timing": timing(ms), "speedup": ratio_}


def refused(server: LiveServer, record: dict[str, Any]) -> tuple[list[Any], str]:
    answer = httpx.post(f"{server.url}/v1/records", json=record, headers=AUTH, timeout=30)
    assert answer.status_code == 422, answer.text
    return [e["loc"] for e in answer.json()["errors"]], answer.text


def test_a_timing_of_one_sample_with_a_spread_is_refused(server: LiveServer) -> None:
    """The audit's ``repeats: 1`` with min 0.5, max 2 and an iqr of 0.1 ms: one sample has none."""
    where, said = refused(server, body(timing(1.0, 0.5, 2.0, 0.1, repeats=1)))
    assert ["body", "timing"] in [loc[:2] for loc in where]
    assert "repeats" in said and "one sample" in said


def test_an_iqr_wider_than_the_range_is_refused(server: LiveServer) -> None:
    where, said = refused(server, body(timing(1.0, 0.99, 1.01, 0.5)))
    assert ["body", "timing"] in [loc[:2] for loc in where]
    assert "iqr_ms" in said


def test_a_speedup_of_one_round_with_an_interval_is_refused(server: LiveServer) -> None:
    """One round has one ratio: its interval is the reproducibility floor around it, no more."""
    default = eager(0.5, 50.0, 40.0, 60.0, rounds=1, name="default_config")
    where, said = refused(server, body(timing(0.01), default))
    assert ["body", "baselines"] in [loc[:2] for loc in where]
    assert "one round" in said


@pytest.mark.parametrize(
    ("baseline", "named"),
    [
        # winner 1 ms, eager 1 ms, "1000x faster than eager" (999-1001x): the audit's first
        (eager(1.0, 1000.0, 999.0, 1001.0), "torch_eager"),
        # a default config timed at 0.001 ms, 1000x faster than the winner, "50x slower"
        (eager(0.001, 50.0, 40.0, 60.0, rounds=2, name="default_config"), "default_config"),
        # the other way: eager timed 100x slower, claimed the same
        (eager(100.0, 1.0, 0.99, 1.01), "torch_eager"),
    ],
)
def test_a_speedup_its_timings_contradict_is_refused(
    server: LiveServer, baseline: dict[str, Any], named: str
) -> None:
    where, said = refused(server, body(timing(1.0), baseline))
    assert ["body", "baselines"] in [loc[:2] for loc in where]
    assert named in said and "speedup" in said


def test_a_record_of_a_real_tune_is_accepted(server: LiveServer, tmp_path: Path) -> None:
    """The product's own record, tuned here: TVM, its interleaved final comparison."""
    quick = TimerSettings(warmup=1, min_repeats=3, max_repeats=5, target_s=0.01)
    key = key_for("matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32")
    outcome = tune(key, Budget(trials=2), TuneOptions(workdir=tmp_path, timer=quick, workers=1))
    record = outcome.record.model_dump(mode="json", by_alias=True)
    assert any(b["speedup"] for b in record["baselines"])
    answer = httpx.post(f"{server.url}/v1/records", json=record, headers=AUTH, timeout=30)
    assert answer.status_code == 201, answer.text


def test_what_the_product_times_is_accepted(server: LiveServer) -> None:
    """Triton's do_bench: one call (``repeats`` 1) whose p20 and p80 are its min and max; a
    timing of two samples, whose exclusive quartiles reach past them (iqr 1.5x their range); a
    comparison of one round (its interval the reproducibility floor)."""
    do_bench = timing_of([0.02842, 0.0281, 0.0290])
    assert do_bench is not None and do_bench.repeats == 1 and do_bench.min_ms < do_bench.max_ms
    two = time_cpu(lambda: sum(range(2000)), TimerSettings(warmup=0, min_repeats=2,
                                                           max_repeats=2, target_s=0))  # fmt: skip
    one_round = ratio([[0.03, 0.02842]], 0, 1)
    speedup = Speedup(median=one_round.median, low=one_round.low, high=one_round.high, rounds=1)
    default = {"name": "default_config", "timing": do_bench.model_dump(mode="json"),
               "speedup": speedup.model_dump()}  # fmt: skip
    for winner in (do_bench, two):
        record = body(winner.model_dump(mode="json"), default if winner is do_bench else {
            "name": "torch_eager", "timing": two.model_dump(mode="json")})  # fmt: skip
        answer = httpx.post(f"{server.url}/v1/records", json=record, headers=AUTH, timeout=30)
        assert answer.status_code == 201, answer.text


def test_two_samples_have_quartiles_past_their_range() -> None:
    """Why an iqr may reach 1.5x the range: Python's exclusive quartiles of two samples."""
    q1, _, q3 = statistics.quantiles([1.0, 2.0], n=4)
    assert q3 - q1 == pytest.approx(1.5)
    TimingModel(median_ms=1.5, min_ms=1.0, max_ms=2.0, iqr_ms=1.5, repeats=2)
    with pytest.raises(ValidationError, match="iqr_ms"):
        TimingModel(median_ms=1.5, min_ms=1.0, max_ms=2.0, iqr_ms=1.6, repeats=2)


def test_records_stored_before_are_read_as_they_are() -> None:
    """A contradictory record stored before the checks is still read back by the server (a
    listing of it would fail whole) and by clients, as the other checks of an upload are."""
    record = body(timing(1.0, 0.5, 2.0, 0.1, repeats=1), eager(1.0, 1000.0, 999.0, 1001.0))
    stored = {**record, "id": 1, "key_hash": "0" * 64, "created_at": datetime.now(UTC)}
    for context in (STORED, SERVED):
        read = RecordPublic.model_validate(stored, context=context)
        assert read.speedup() == 1000.0
    with pytest.raises(ValidationError, match="one sample"):  # as uploaded: refused
        RecordPublic.model_validate(stored)


def test_the_rules_name_the_products_own_constants() -> None:
    """measured.py cannot import them (the timers and the interleaving import it)."""
    from tunecache import interleave, measured
    from tunecache.triton import hostbench, record

    assert measured.ONE_ROUND_REACH == interleave.REPRODUCIBLE
    assert {record.DO_BENCH_TIMER, hostbench.TIMER} == measured.SUMMING_TIMERS
