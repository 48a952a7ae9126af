"""The unscheduled module as the golden reference of a user's own TVM module.

A user's PrimFunc comes with no reference implementation, but TVM's default lowering of the
unscheduled module is one: a schedule only reorders the same computation. :class:`Reference`
compiles it once, finds its outputs (the arguments a call changes: no IR analysis needed, so
TE and TVMScript functions alike) and computes them on seeded random non-zero inputs. Every run,
the reference's own included, starts with NaN in the outputs (integers and flags: a value one
seed's runs start with, the other's another), so an element a schedule never writes stays NaN
and fails the comparison (an integer or flag, with one of two seeds at least, unless both
seeds' expected values are their fills).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends.tvm.runnable import compile_module
from tunecache.devicelock import timing_on
from tunecache.errors import InvalidInput

if TYPE_CHECKING:
    import torch
    from tvm.ir import IRModule
    from tvm.runtime import Module

INT_POISON = -0x5EED  # what integer outputs hold before a run
REPEAT, MIN_REPEAT_MS = 5, 50  # timing: each of REPEAT measurements runs at least this long


@dataclass(frozen=True)
class Argument:
    """One parameter of the function: its shape and dtype (from MetaSchedule's ``ArgInfo``)."""

    shape: tuple[int, ...]
    dtype: str


def require_fixed_shapes(mod: IRModule, what: str) -> None:
    """Checks that every buffer of ``mod``'s PrimFunc has a fixed shape (a tune times one shape,
    and MetaSchedule's argument info cannot take a variable: a ``TypeError`` deep in TVM).

    Raises:
        InvalidInput: one line naming ``what``, the buffer and the dimension.
    """
    from tvm.tirx import IntImm, PrimFunc

    for _, func in mod.functions_items():
        if not isinstance(func, PrimFunc):
            continue
        for param in func.params:
            for i, dim in enumerate(getattr(param, "shape", None) or ()):
                if not isinstance(dim, IntImm):
                    raise InvalidInput(
                        f"{what}: its buffers must have fixed shapes, but buffer "
                        f"{str(param.name)!r} has dimension {i} = {dim} (not a number): write "
                        "the shape to tune as numbers (one function per shape)"
                    )


def arguments(mod: IRModule) -> list[Argument]:
    """The parameters of ``mod``'s entry function.

    Raises:
        InvalidInput: a buffer of dynamic shape, or a parameter that is not a tensor of static
            shape.
    """
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    require_fixed_shapes(mod, "the module")
    found = []
    for i, info in enumerate(ArgInfo.from_entry_func(mod, remove_preproc=True)):
        kind, dtype, shape = info.as_json()
        if kind != "TENSOR" or not all(isinstance(d, int) for d in shape):
            raise InvalidInput(f"argument {i} is not a tensor of static shape: {shape}")
        found.append(Argument(tuple(shape), str(dtype)))
    return found


class Reference:
    """The unscheduled ``mod`` compiled for ``target``, and its outputs on each seed's inputs.

    Raises:
        TuningError: the unscheduled module does not compile.
        InvalidInput: it has a non-tensor or dynamic argument, changes none of its arguments, or
            gives NaN or inf (or leaves an output element unwritten) on random inputs.
    """

    def __init__(self, mod: IRModule, target: Mapping[str, Any], seeds: Sequence[int]) -> None:
        self.args = arguments(mod)
        self.lib = compile_module(mod, target)
        self.outputs = self._find_outputs()  # before any poisoning
        self.seeds = tuple(seeds)
        self.expected = [self.run(self.lib, seed) for seed in self.seeds]
        if not all(bool(out.isfinite().all()) for outs in self.expected for out in outs):
            raise InvalidInput(
                "the unscheduled function leaves outputs unwritten, or computes "
                "NaN or inf, on random inputs: there is nothing to compare with"
            )

    def inputs(self, seed: int) -> list[torch.Tensor]:
        """Every argument for ``seed``: random non-zero values, outputs poisoned."""
        return _values(self.args, seed, self.outputs)

    def run(self, lib: Module, seed: int) -> list[torch.Tensor]:
        """The outputs ``lib`` computes from ``seed``'s inputs (poisoned before the call)."""
        values = self.inputs(seed)
        lib["main"](*values)
        return [values[i] for i in self.outputs]

    def time_ms(self, lib: Module) -> float:
        """Mean milliseconds of one call of ``lib`` (TVM's ``time_evaluator``, this process)."""
        import tvm

        timer = lib.time_evaluator(
            "main", tvm.cpu(), number=1, repeat=REPEAT, min_repeat_ms=MIN_REPEAT_MS
        )
        inputs = self.inputs(self.seeds[0])
        with timing_on("cpu"):  # the cores' turn (tunecache.devicelock)
            return float(timer(*inputs).mean) * 1e3

    def _find_outputs(self) -> tuple[int, ...]:
        import torch

        values = _values(self.args, 0, ())
        before = [v.clone() for v in values]
        self.lib["main"](*values)
        changed = tuple(
            i for i, (a, b) in enumerate(zip(before, values, strict=True)) if not torch.equal(a, b)
        )
        if not changed:
            raise InvalidInput("the function changes none of its arguments: nothing to check")
        return changed


def _values(args: Sequence[Argument], seed: int, poisoned: Sequence[int]) -> list[torch.Tensor]:
    """A value per argument: seeded random non-zero numbers, NaN (or a sentinel) where poisoned."""
    import torch

    from workloads.base import random_nonzero, torch_dtype

    generator = torch.Generator().manual_seed(seed)
    values = []
    for i, arg in enumerate(args):
        dtype = torch_dtype(arg.dtype)
        if i in poisoned:
            values.append(torch.full(arg.shape, _poison(dtype, seed), dtype=dtype))
        elif dtype.is_floating_point:
            values.append(random_nonzero(arg.shape, arg.dtype, generator))
        else:  # small positive integers: index-like inputs stay in range more often
            low, high = (0, 2) if dtype == torch.bool else (1, 4)
            values.append(torch.randint(low, high, arg.shape, generator=generator, dtype=dtype))
    return values


def _poison(dtype: torch.dtype, seed: int) -> float | int | bool:
    """What an output of ``dtype`` holds before a run of ``seed``: NaN; for integers and
    flags, an odd seed's fill and an even seed's differ (``True`` or ``False``; ``-0x5EED`` or
    ``0x5EED``, else values neither zero nor saturated: ``int8``'s -95 or 95, ``uint8``'s 170
    or 85). One fill passed an unwritten element whose expected value it was (``True`` for
    ``A != 0``); -0x5EED in int8 raised "cannot be converted to type int8_t without overflow"."""
    import torch

    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    odd = seed % 2 == 1
    if dtype == torch.bool:
        return odd
    info = torch.iinfo(dtype)
    sentinel = INT_POISON if odd else -INT_POISON
    if info.min <= sentinel <= info.max:
        return sentinel
    if info.min < 0:  # neither zero nor a saturated value, what clamping kernels write
        return -(info.max * 3 // 4) if odd else info.max * 3 // 4
    return info.max * 2 // 3 if odd else info.max // 3
