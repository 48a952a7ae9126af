"""Validation against the golden reference, and timing."""

from __future__ import annotations

import time

import pytest
import torch

from tunecache.timing import TimerSettings, time_cpu
from tuner.validation import validate
from workloads import get_workload

MATMUL = get_workload("matmul")
SOFTMAX = get_workload("softmax")
PROBLEM = {"M": 16, "N": 24, "K": 8}


def correct(p):  # type: ignore[no-untyped-def]
    return MATMUL.torch_fn


@pytest.mark.parametrize(
    ("runnable", "note"),
    [
        (lambda a, b: (a @ b) * 1.01, ""),  # slightly wrong
        (lambda a, b: a @ b + float("nan"), "NaN"),
        (lambda a, b: (a @ b)[:, :-1], "shape"),
        (lambda a, b: torch.zeros(a.shape[0], b.shape[1]), ""),  # output never written
        (lambda a, b: 1 / 0, "ZeroDivisionError"),
    ],
)
def test_wrong_candidates_are_rejected(runnable, note: str) -> None:  # type: ignore[no-untyped-def]
    report = validate(lambda p: runnable, MATMUL, PROBLEM, "float32")
    assert not report.passed
    assert any(not c.passed for c in report.checks)
    assert note in " ".join(c.note for c in report.checks)


def test_correct_candidate_passes_on_seeds_and_edge_problem() -> None:
    built: list[dict] = []

    def build(p):  # type: ignore[no-untyped-def]
        built.append(dict(p))
        return MATMUL.torch_fn

    report = validate(build, MATMUL, PROBLEM, "float32", seeds=(1, 2, 3))
    assert report.passed and report.max_rel_error is not None
    assert report.max_rel_error < MATMUL.tolerance("float32")
    assert built == [PROBLEM, {"M": 15, "N": 23, "K": 7}]
    assert [c.seed for c in report.checks] == [1, 2, 3, 1]


def test_candidate_correct_only_at_the_tuned_shape_is_rejected() -> None:
    def build(p):  # type: ignore[no-untyped-def]
        if p == PROBLEM:
            return MATMUL.torch_fn
        return lambda a, b: (a @ b)[:, :-1]  # drops the ragged edge

    report = validate(build, MATMUL, PROBLEM, "float32")
    assert not report.passed
    assert [c.passed for c in report.checks] == [True, True, True, False]


def test_stale_output_is_caught_by_fresh_seeds() -> None:
    cache: dict[str, torch.Tensor] = {}

    def stale(x: torch.Tensor) -> torch.Tensor:  # computes once, then replays the first answer
        if "out" not in cache:
            cache["out"] = SOFTMAX.torch_fn(x)
        return cache["out"]

    report = validate(lambda p: stale, SOFTMAX, {"M": 4, "N": 32}, "float32", edge=False)
    assert [c.passed for c in report.checks] == [True, False, False]


def test_softmax_without_max_subtraction_is_within_float32_or_caught() -> None:
    def naive(x: torch.Tensor) -> torch.Tensor:
        e = x.exp()
        return e / e.sum(-1, keepdim=True)

    report = validate(lambda p: naive, SOFTMAX, {"M": 8, "N": 64}, "float32", edge=False)
    # Logits are bounded (|x| ≤ 8) so the naive form is still accurate in float32: validation
    # must not reject a numerically fine kernel.
    assert report.passed


def test_build_failure_is_a_failed_check() -> None:
    def build(p):  # type: ignore[no-untyped-def]
        raise RuntimeError("no such intrinsic")

    report = validate(build, MATMUL, PROBLEM, "float32")
    assert not report.passed and "no such intrinsic" in report.checks[0].note


def test_timer_measures_at_least_the_work() -> None:
    settings = TimerSettings(warmup=1, min_repeats=5, max_repeats=5, min_sample_s=0, target_s=0)
    timing = time_cpu(lambda: time.sleep(0.002), settings)
    assert timing.repeats == 5 and timing.warmup == 1
    assert timing.min_ms <= timing.median_ms <= timing.max_ms
    assert timing.min_ms >= 2.0  # a 2 ms sleep cannot measure shorter


def test_timer_batches_fast_calls() -> None:
    timing = time_cpu(lambda: None, TimerSettings(min_repeats=3, max_repeats=3, target_s=0))
    assert timing.repeats > 3  # several calls per sample for a call far below the timer's grain
    assert "calls" in timing.timer


class SkipsTheLastColumn:
    """Writes every element of its output buffer but the last column: a ragged-edge bug that a
    zero- or garbage-initialised buffer can hide when the reference happens to be close."""

    takes_out = True

    def __call__(self, a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
        out[:, :-1] = (a @ b)[:, :-1]
        return out


def test_an_element_never_written_fails_through_the_poisoned_buffer() -> None:
    report = validate(lambda p: SkipsTheLastColumn(), MATMUL, PROBLEM, "float32")
    assert not report.passed
    assert all("NaN" in c.note for c in report.checks)  # the poison, left where nothing wrote


def test_a_runnable_that_writes_everything_passes_with_the_poisoned_buffer() -> None:
    class Writes:
        takes_out = True

        def __call__(self, a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
            assert torch.isnan(out).all()  # it was poisoned before the run
            return torch.matmul(a, b, out=out)

    assert validate(lambda p: Writes(), MATMUL, PROBLEM, "float32").passed
