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
    out = torch.zeros(8)  # all zero: drawn as any other (not kept non-negative)
    args, kwargs = fresh_call((a, 3, index), {"out": out}, SEED)
    again, kwargs_again = fresh_call((a, 3, index), {"out": out}, SEED)
    assert torch.equal(args[0], again[0]) and torch.equal(kwargs["out"], kwargs_again["out"])
    assert args[0].dtype == torch.float16 and args[0].shape == a.shape and args[0].abs().sum() > 0
    assert torch.equal(a, torch.zeros_like(a))  # the caller's tensor untouched
    assert args[1] == 3 and torch.equal(args[2], index) and args[2] is not index
    # One stream, positional first: the keyword tensor follows the positional one's values.
    stream = torch.Generator().manual_seed(SEED)
    assert torch.equal(args[0], torch.empty(64, 32, dtype=torch.float16).normal_(generator=stream))
    assert torch.equal(kwargs["out"], torch.empty(8).normal_(generator=stream))
    assert not torch.equal(fresh_arguments([a], SEED + 1)[0], args[0])


def test_a_padded_view_is_copied_with_its_strides_and_its_whole_span() -> None:
    """A kernel is passed the caller's strides: a compact copy of ``x[:, :100]`` of a 128-wide
    buffer would be addressed past its end."""
    buffer = torch.zeros(64, 128)
    view = buffer[:, :100]
    (copy,) = fresh_arguments([view], SEED)
    assert copy.shape == view.shape and copy.stride() == (128, 1)
    # Every element the kernel can address (row r, column c at r * 128 + c) is inside the copy.
    assert copy.untyped_storage().nbytes() >= (63 * 128 + 100) * 4
    indices = torch.tensor([[7, 9], [3, 4]]).t()  # a transposed integer argument
    (same,) = fresh_arguments([indices], SEED)
    assert same.stride() == indices.stride() and torch.equal(same, indices)


def test_arguments_that_share_memory_share_it_in_their_copies() -> None:
    x = torch.zeros(16, 8)
    left, right = x[:, :4], x[:, 4:]
    got = fresh_arguments([x, left, 5, right, x], SEED)
    assert got[0].data_ptr() == got[4].data_ptr()  # the same tensor twice: one copy
    assert got[3].data_ptr() - got[1].data_ptr() == right.data_ptr() - left.data_ptr()
    got[0][2, 6] = 42.0  # written through one argument, read through another
    assert got[3][2, 2] == 42.0 and got[4][2, 6] == 42.0
    assert got[2] == 5 and torch.equal(x, torch.zeros(16, 8))
    unrelated = fresh_arguments([torch.zeros(4), torch.zeros(4)], SEED)
    assert unrelated[0].data_ptr() != unrelated[1].data_ptr()
    assert not torch.equal(unrelated[0], unrelated[1])  # one stream: the second draws on


def test_a_broadcast_argument_keeps_its_zero_stride() -> None:
    row = torch.zeros(1, 32).expand(16, 32)
    (copy,) = fresh_arguments([row], SEED)
    assert copy.stride() == (0, 1) and torch.equal(copy[0], copy[15])


def test_outputs_of_different_shapes_fail_the_check() -> None:
    check = compare_outputs([torch.zeros(2, 3)], [torch.zeros(3, 2)], 1e-4, {"n": 1})
    assert not check.passed and check.note == "shape (2, 3) != (3, 2)"


@pytest.mark.parametrize("factor", [1.5, -1.0])
def test_an_error_beyond_float64_fails_the_check(factor: float) -> None:
    """Norms of values near float64's largest overflow to inf; inf / inf is NaN and ``max(0.0,
    nan)`` is 0.0: such an output would have passed whatever its error."""
    want = torch.full((1000,), 1e307, dtype=torch.float64)
    check = compare_outputs([want * factor], [want], 1e-4, {"n": 1})
    assert not check.passed and check.rel_error is None


def test_a_non_negative_argument_gets_non_negative_copies_only_when_asked() -> None:
    """``x / (sqrt(v) + eps)`` for the caller's ``v > 0``: a normal draw of ``v`` made the
    reference's output NaN, and the check could judge nothing; so a second draw keeps the sign.
    Not the first: a config wrong only on negative values passed on the copies of a call whose
    data happened to be non-negative, and was uploaded as validated for every caller."""
    v, x = torch.rand(100) + 0.1, torch.randn(100)
    copies = fresh_arguments([v, x], SEED, keep_sign=True)
    assert bool((copies[0] >= 0).all()) and bool((copies[1] < 0).any())
    first = fresh_arguments([v, x], SEED)
    assert bool((first[0] < 0).any())  # the first draw probes negative values too
