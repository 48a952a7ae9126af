"""Loading a user's TVM module from ``FILE.py:NAME`` (``tunecache tune --tvm``).

``NAME`` is a ``PrimFunc`` (``te.create_prim_func`` or ``@T.prim_func``), an ``IRModule`` with
one PrimFunc (``@I.ir_module``), or a function of no arguments returning one of those. The
result is normalised exactly as ``compile_tir`` normalises what it is given, so the workload key
computed here is the one a later ``compile_tir(db, NAME, target)`` looks up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tunecache.errors import InvalidInput, one_line
from tunecache.userfile import load_name

if TYPE_CHECKING:
    from tvm.ir import IRModule


def load_module(spec: str) -> IRModule:
    """The normalised one-function module ``spec`` (``FILE.py:NAME``) names.

    Raises:
        InvalidInput: one line naming what is wrong (no such file, no NAME, an exception while
            loading, not a TVM PrimFunc or IRModule).
    """
    _, _, found = load_name("--tvm", spec)
    what = f"--tvm {spec!r}: {spec.rpartition(':')[2]}"
    return _normalize(_as_tvm(found, what), what)


def _as_tvm(value: Any, what: str) -> Any:
    """``value`` when it is a PrimFunc or IRModule, else what a zero-argument call returns."""
    import tvm

    kinds = (tvm.tirx.PrimFunc, tvm.IRModule)
    if isinstance(value, type):  # a class (an nn.Module's): called, it said a TypeError
        kind = "an nn.Module, for tune --torch" if _is_module(value) else "a class"
        raise InvalidInput(f"{what} is {kind}, not a TVM PrimFunc or IRModule (or a function "
                           "of no arguments returning one)")  # fmt: skip
    if not isinstance(value, kinds) and callable(value):
        try:
            value = value()
        except Exception as exc:
            raise InvalidInput(f"{what}() raised {one_line(exc)}") from None
    if not isinstance(value, kinds):
        raise InvalidInput(
            f"{what} is of type {type(value).__name__}, not a TVM PrimFunc or IRModule "
            "(or a function of no arguments returning one)"
        )
    return value


def _is_module(cls: type) -> bool:
    """Whether ``cls`` is a torch ``nn.Module`` (by its bases' names: torch is not imported)."""
    return any(f"{base.__module__}.{base.__qualname__}" == "torch.nn.modules.module.Module"
               for base in cls.__mro__)  # fmt: skip


def _normalize(value: Any, what: str) -> IRModule:
    """``value`` as MetaSchedule's one-function module named ``main``."""
    import tvm
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    if isinstance(value, tvm.IRModule):
        funcs = list(value.functions_items())
        prims = [f for _, f in funcs if isinstance(f, tvm.tirx.PrimFunc)]
        if len(funcs) != 1 or len(prims) != 1:
            raise InvalidInput(
                f"{what} is an IRModule of {len(funcs)} functions ({len(prims)} PrimFuncs); "
                "tune --tvm tunes a module of one PrimFunc"
            )
    try:
        mod: IRModule = _normalize_mod(value)
    except Exception as exc:
        raise InvalidInput(f"{what}: MetaSchedule cannot tune it: {one_line(exc)}") from None
    return mod
