"""Compiling a PrimFunc for llvm and wrapping it as a :data:`backends.base.Runnable`.

The runnable passes torch tensors straight to the compiled function: TVM's FFI (apache-tvm-ffi)
takes any object with ``__dlpack__`` and views its memory without copying. The output is
allocated with ``torch.empty`` on each call, unless the caller passes its own ``out=`` buffer for
the kernel to write into; the function is looked up once, at build time. Overhead per call is
~3 µs (0.5 µs the FFI call, 1–1.5 µs ``torch.empty``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tunecache.errors import TuningError

if TYPE_CHECKING:
    import torch
    from tvm.ir import IRModule
    from tvm.runtime import Module
    from tvm.tirx import PrimFunc

    from backends.base import Runnable


def compile_module(mod: IRModule | PrimFunc, target: Mapping[str, Any]) -> Module:
    """``mod`` compiled for ``target`` (a target dict).

    Raises:
        TuningError: TVM failed to lower or compile it.
    """
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    try:
        if isinstance(mod, tvm.IRModule):
            mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
        return tvm.tirx.build(mod, target=tvm.target.Target(dict(target)))
    except Exception as exc:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        raise TuningError(f"TVM could not compile the kernel: {' | '.join(lines[-3:])}") from exc


def make_runnable(lib: Module, output_shape: tuple[int, ...], dtype: torch.dtype) -> Runnable:
    """A callable ``(*inputs, out=None) -> output`` over CPU torch tensors, calling
    ``lib["main"]``.

    The compiled function writes the output into ``out`` when given (it must have the output's
    shape and dtype, be contiguous and on the inputs' device; the kernel writes it in place, so an
    element it never writes keeps its value), else into a new tensor; either is returned.
    """
    import torch

    func = lib["main"]
    shape = tuple(output_shape)

    empty = torch.empty

    def run(*inputs: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        # The compiled function checks every shape, dtype and stride: a non-contiguous or
        # mistyped input raises ValueError / TypeError naming the argument.
        if out is None:
            out = empty(shape, dtype=dtype)
        else:
            check_out(out, shape, dtype, inputs[0].device if inputs else torch.device("cpu"))
        func(*inputs, out)
        return out

    run.module = lib  # type: ignore[attr-defined]  # keeps the code alive and inspectable
    run.takes_out = True  # type: ignore[attr-defined]  # validation poisons the buffer
    return run


def check_out(
    out: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> None:
    """Raises ValueError naming what keeps ``out`` from taking a ``shape`` ``dtype`` output."""
    wrong = [
        f"{what} {got}, not {want}"
        for what, got, want in (
            ("shape", tuple(out.shape), shape),
            ("dtype", out.dtype, dtype),
            ("device", out.device, device),
        )
        if got != want
    ]
    if not out.is_contiguous():
        wrong.append(f"strides {out.stride()}, not contiguous")
    if wrong:
        raise ValueError(f"out has {'; '.join(wrong)}")
