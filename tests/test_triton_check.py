"""The drop-in's check of a config's outputs (``tunecache.triton.check``): seeded copies of a
call's arguments, and a comparison in float64 a chunk at a time on the tensors' device.

The comparison is held to the one-shot float64 computation it replaced, across chunk boundaries;
a GPU test (``tests/test_gpu.py``) holds the device path to the host's."""

from __future__ import annotations

import pytest
import torch

from tunecache.closeness import CHUNK
from tunecache.triton.check import SEED, compare_outputs, fresh_arguments, fresh_call


def _direct(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    diff = got.double() - want.double()
    return (diff.norm() / want.double().norm()).item(), diff.abs().max().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_the_chunked_comparison_equals_the_direct_one_across_chunks(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(7)
    want = torch.randn(CHUNK + 4099, generator=generator).to(dtype)
    got = want.clone()
    got[CHUNK - 3 : CHUNK + 5] += 0.25  # a difference on both sides of the first boundary
    got[-1] -= 1.0  # and in the last, partial chunk
    check = compare_outputs([got], [want], 1e-4, {"n": want.numel()})
    rel, largest = _direct(got, want)
    assert check.rel_error == pytest.approx(rel, rel=1e-9)
    assert check.max_abs_error == pytest.approx(largest, rel=1e-12)
    assert not check.passed  # 1.0 off in one element of four million is over 1e-4


def test_a_transposed_output_is_compared_element_for_element() -> None:
    want = torch.randn(300, 200, generator=torch.Generator().manual_seed(1)).t()
    got = want.contiguous().clone()  # the same values, another layout
    assert compare_outputs([got], [want], 1e-12, {"n": 1}).rel_error == 0.0
    got[5, 7] += 1.0
    check = compare_outputs([got], [want], 1e-4, {"n": 1})
    assert check.max_abs_error == pytest.approx(1.0) and not check.passed


def test_a_nan_in_the_last_chunk_fails_the_check() -> None:
    want = torch.ones(CHUNK + 10)
    got = want.clone()
    got[-2] = float("nan")
    check = compare_outputs([torch.ones(3), got], [torch.ones(3), want], 1e-2, {"n": 1})
    assert not check.passed and check.note == "output has NaN or inf"


def test_large_float64_values_do_not_overflow_the_norm() -> None:
    want = torch.full((1000,), 1e200, dtype=torch.float64)
    got = want * (1 + 1e-6)
    check = compare_outputs([got], [want], 1e-4, {"n": 1})
    assert check.rel_error == pytest.approx(1e-6, rel=1e-6) and check.passed


def test_an_all_zero_reference_is_judged_by_the_absolute_difference() -> None:
    want = torch.zeros(10)
    assert compare_outputs([want.clone()], [want], 1e-4, {"n": 1}).passed
    check = compare_outputs([torch.full((10,), 0.1)], [want], 1e-4, {"n": 1})
    assert check.rel_error == pytest.approx(0.1 * 10**0.5) and not check.passed


def test_fresh_copies_are_identical_seeded_and_never_the_callers() -> None:
    a = torch.zeros(64, 32, dtype=torch.float16)
    index = torch.arange(5)
    args, kwargs = fresh_call((a, 3, index), {"out": torch.empty(8)}, SEED)
    again, kwargs_again = fresh_call((a, 3, index), {"out": torch.empty(8)}, SEED)
    assert torch.equal(args[0], again[0]) and torch.equal(kwargs["out"], kwargs_again["out"])
    assert args[0].dtype == torch.float16 and args[0].shape == a.shape and args[0].abs().sum() > 0
    assert torch.equal(a, torch.zeros_like(a))  # the caller's tensor untouched
    assert args[1] == 3 and torch.equal(args[2], index) and args[2] is not index
    # One stream, positional first: the keyword tensor follows the positional one's values.
    stream = torch.Generator().manual_seed(SEED)
    first = torch.randn(64, 32, generator=stream).to(torch.float16)
    assert torch.equal(args[0], first)
    assert torch.equal(kwargs["out"], torch.randn(8, generator=stream))
    assert not torch.equal(fresh_arguments([a], SEED + 1)[0], args[0])
