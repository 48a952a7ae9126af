"""The check of a Triton config's outputs: fresh seeded copies of a call's arguments, and the
outputs of two runs on them compared at a tolerance.

Everything happens on the tensors' own device (:mod:`tunecache.closeness` compares). On an H200,
making the copies on the host and comparing them there in float64 made ``verify="first"`` slower
than the local benchmarks it spares (bench/results/h200-2026-11-27).

A copy has its argument's strides, and arguments that share memory share it in their copies at
the same distances: a kernel is passed the caller's strides and sizes, and addresses memory by
them, so a compact copy of a padded view would be read and written out of bounds.

Copies are normal draws. Only where the reference's output on them holds NaN or inf is the
check drawn again (``keep_sign``) with non-negative copies of each floating-point argument whose
values are all non-negative and not all zero (a variance, a scale, a probability): a kernel
computing ``x / (sqrt(v) + eps)`` for the caller's positive ``v`` gave NaN on a normal draw, for
the reference as for the config, and the check could not judge anything. Not at first: a config
wrong only on negative values (a masked tail loaded as 0.0 into a row's maximum) passed on the
copies of a call whose data happened to be non-negative, and was uploaded as validated for every
caller at the key. An all-zero tensor says nothing of its range (an output, an accumulator): it
is drawn as the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tunecache.closeness import relative_errors
from tunecache.schemas import CheckModel

SEED = 1234
# Dtypes that ``normal_`` fills in place (others, float8 say, are drawn in float32 and cast).
_NORMAL_DTYPES = ("float16", "bfloat16", "float32", "float64")


def fresh_arguments(args: Sequence[Any], seed: int, *, keep_sign: bool = False) -> list[Any]:
    """Copies of ``args``: floating-point tensors refilled with seeded random values, generated
    on their device (one seeded stream per device, in argument order; with ``keep_sign``,
    non-negative for an argument holding only non-negative values, some positive), other
    tensors with their values; each copy with its argument's strides, and aliasing arguments
    aliasing in their copies."""
    import torch

    generators: dict[Any, torch.Generator] = {}
    fresh = list(args)
    for group in _memory_groups(args):
        first = args[group[0]]
        base = min(args[i].storage_offset() for i in group)
        end = max(args[i].storage_offset() + _span(args[i]) for i in group)
        if first.is_floating_point():
            buffer = _seeded(end - base, first, generators, seed)
            if keep_sign and _non_negative([args[i] for i in group]):
                buffer = buffer.abs()
        else:  # indices, masks: their values matter; the span as it is
            buffer = first.as_strided((end - base,), (1,), base).clone()
        for i in group:
            fresh[i] = buffer.as_strided(args[i].shape, args[i].stride(),
                                         args[i].storage_offset() - base)  # fmt: skip
    return fresh


def _non_negative(tensors: Sequence[Any]) -> bool:
    """Whether ``tensors`` hold no negative value (nor NaN) and at least one positive one."""
    import torch

    floats = [t for t in tensors if t.numel()]
    with torch.no_grad():
        return bool(floats) and all(bool((t >= 0).all()) for t in floats) and \
            any(bool((t > 0).any()) for t in floats)  # fmt: skip


def _memory_groups(args: Sequence[Any]) -> list[list[int]]:
    """The positions of the tensor arguments, grouped where they share memory (same storage,
    device and dtype), in order of first appearance."""
    import torch

    groups: dict[Any, list[int]] = {}
    for i, arg in enumerate(args):
        if not isinstance(arg, torch.Tensor):
            continue
        try:
            memory = arg.untyped_storage().data_ptr() if arg.numel() else None
        except (RuntimeError, NotImplementedError):  # a tensor without storage of its own
            memory = None
        key = (arg.device, arg.dtype, memory) if memory else i
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _span(tensor: Any) -> int:
    """Elements from a view's first addressable element to its last, inclusive."""
    if tensor.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(),
                                                                strict=True))  # fmt: skip


def _seeded(count: int, like: Any, generators: dict[Any, Any], seed: int) -> Any:
    """``count`` standard-normal values of ``like``'s dtype on its device, from that device's
    seeded stream (the host's, then a copy, for a device without generators)."""
    import torch

    device = like.device
    if device not in generators:
        try:
            generators[device] = torch.Generator(device=device).manual_seed(seed)
        except (RuntimeError, TypeError, ValueError, NotImplementedError):
            generators[device] = torch.Generator().manual_seed(seed)
    generator = generators[device]
    if str(like.dtype).removeprefix("torch.") in _NORMAL_DTYPES:
        values = torch.empty(count, dtype=like.dtype, device=generator.device)
        values.normal_(generator=generator)
    else:
        values = torch.randn(count, generator=generator, dtype=torch.float32,
                             device=generator.device).to(like.dtype)  # fmt: skip
    return values.to(device)


def fresh_call(
    args: Sequence[Any], kwargs: Mapping[str, Any], seed: int, *, keep_sign: bool = False
) -> tuple[list[Any], dict[str, Any]]:
    """:func:`fresh_arguments` of a call's positional and keyword arguments (one seeded stream,
    positional first): two calls with the same ``seed`` get identical copies, and the caller's
    tensors are never written."""
    values = fresh_arguments([*args, *kwargs.values()], seed, keep_sign=keep_sign)
    return values[: len(args)], dict(zip(kwargs, values[len(args) :], strict=True))


def compare_outputs(
    got: Sequence[Any], want: Sequence[Any], tolerance: float, problem: Mapping[str, Any]
) -> CheckModel:
    """The worst relative error over the floating-point tensors of two argument lists, as the
    check of ``problem``; integer and boolean tensors must be equal element for element (an
    integer output has no tolerance)."""
    import torch

    worst, worst_abs = 0.0, 0.0
    for a, b in zip(got, want, strict=True):
        if not isinstance(a, torch.Tensor):
            continue
        b = b.to(a.device)
        if a.shape != b.shape:
            return _check(problem, None, None, tolerance,
                          f"shape {tuple(a.shape)} != {tuple(b.shape)}")  # fmt: skip
        if not a.is_floating_point():
            if not torch.equal(a, b):
                return _check(problem, None, None, tolerance,
                              f"{int((a != b).sum())} of {a.numel()} "
                              f"{str(a.dtype).removeprefix('torch.')} elements differ")  # fmt: skip
            continue
        errors = relative_errors(a, b)
        if errors is None:
            return _check(problem, None, None, tolerance, "output has NaN or inf")
        worst, worst_abs = max(worst, errors[0]), max(worst_abs, errors[1])
    return _check(problem, worst, worst_abs, tolerance, "")


def _check(problem: Mapping[str, Any], rel: float | None, max_abs: float | None,
           tolerance: float, note: str) -> CheckModel:  # fmt: skip
    return CheckModel(problem=dict(problem), seed=SEED, rel_error=rel,
                      max_abs_error=max_abs, tolerance=tolerance,
                      passed=rel is not None and rel <= tolerance, note=note)  # fmt: skip


def finish(call: tuple[list[Any], dict[str, Any]]) -> None:
    """Waits for the work queued on the GPUs of ``call``'s tensors."""
    import torch

    devices = {v.device for v in [*call[0], *call[1].values()] if isinstance(v, torch.Tensor)}
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    if torch.cuda.is_initialized():  # Triton launches on the current device
        torch.cuda.synchronize()


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says the device (or host) ran out of memory: a state of this process.
    Triton's driver says so in a plain RuntimeError when loading a module (the first launch of
    a config) finds no memory; the text is the driver's, not a record's."""
    return (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
            or (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()))  # fmt: skip
