"""The check of a Triton config's outputs: fresh seeded copies of a call's arguments, and the
outputs of two runs on them compared at a tolerance.

Everything happens on the tensors' own device (:mod:`tunecache.closeness` compares). On an H200,
making the copies on the host and comparing them there in float64 made ``verify="first"`` cost
more than the 50 shapes' benchmarks it spares (bench/results/h200-2026-11-27).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tunecache.closeness import relative_errors
from tunecache.schemas import CheckModel

SEED = 1234


def fresh_arguments(args: Sequence[Any], seed: int) -> list[Any]:
    """Copies of ``args`` with every floating-point tensor refilled with seeded random values,
    generated on the tensor's device (one seeded stream per device, in argument order)."""
    import torch

    generators: dict[Any, torch.Generator] = {}
    fresh = []
    for arg in args:
        if isinstance(arg, torch.Tensor) and arg.is_floating_point():
            arg = _seeded_like(arg, generators, seed)
        elif isinstance(arg, torch.Tensor):
            arg = arg.clone()
        fresh.append(arg)
    return fresh


def _seeded_like(arg: Any, generators: dict[Any, Any], seed: int) -> Any:
    """Standard-normal values of ``arg``'s shape and dtype, made on its device when that device
    has a generator of its own (else on the host, then moved)."""
    import torch

    device = arg.device
    if device not in generators:
        try:
            generators[device] = torch.Generator(device=device).manual_seed(seed)
        except RuntimeError:  # a device without generators: the host's stream, then a copy
            generators[device] = torch.Generator().manual_seed(seed)
    generator = generators[device]
    values = torch.randn(arg.shape, generator=generator, dtype=torch.float32,
                         device=generator.device)  # fmt: skip
    return values.to(dtype=arg.dtype, device=device)


def fresh_call(
    args: Sequence[Any], kwargs: Mapping[str, Any], seed: int
) -> tuple[list[Any], dict[str, Any]]:
    """:func:`fresh_arguments` of a call's positional and keyword arguments (one seeded stream,
    positional first): two calls with the same ``seed`` get identical copies, and the caller's
    tensors are never written."""
    values = fresh_arguments([*args, *kwargs.values()], seed)
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
        if not a.is_floating_point():
            b = b.to(a.device)
            if a.shape != b.shape or not torch.equal(a, b):
                differ = int((a != b).sum()) if a.shape == b.shape else a.numel()
                return _check(problem, None, None, tolerance,
                              f"{differ} of {a.numel()} {str(a.dtype).removeprefix('torch.')} "
                              "elements differ")  # fmt: skip
            continue
        errors = relative_errors(a, b)
        if errors is None:
            return _check(problem, None, None, tolerance, "output has NaN or inf")
        rel, largest = errors
        worst, worst_abs = max(worst, rel), max(worst_abs, largest)
    return _check(problem, worst, worst_abs, tolerance, "")


def _check(problem: Mapping[str, Any], rel: float | None, max_abs: float | None,
           tolerance: float, note: str) -> CheckModel:  # fmt: skip
    return CheckModel(problem=dict(problem), seed=SEED, rel_error=rel,
                      max_abs_error=max_abs, tolerance=tolerance,
                      passed=rel is not None and rel <= tolerance, note=note)  # fmt: skip
