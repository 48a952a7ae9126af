"""Workloads (the tuner side of kernels: inputs, reference, per-backend code), by name.

Built-in ones by their names; a user's own kernel, a :class:`Workload` subclass anywhere, by
``"package.module:QualName"``.

Example:
    >>> from workloads import get_workload
    >>> get_workload("matmul").params
    ('M', 'N', 'K')
"""

from __future__ import annotations

from tunecache.errors import InvalidInput
from tunecache.kernels import load_ref
from workloads.base import Workload
from workloads.bias_gelu import BiasGelu
from workloads.layernorm import LayerNorm
from workloads.matmul import Matmul
from workloads.rmsnorm import RMSNorm
from workloads.softmax import Softmax

WORKLOADS: dict[str, Workload] = {
    w.name: w for w in (Matmul(), Softmax(), LayerNorm(), BiasGelu(), RMSNorm())
}


def get_workload(name: str) -> Workload:
    """The workload called ``name``: a built-in name or ``"package.module:QualName"``.

    Raises:
        InvalidInput: no workload has that name (the message lists the built-in ones), the
            reference does not name a :class:`Workload` subclass or instance, or it names a
            subclass that leaves methods abstract (the message names them and where they are).
    """
    if name in WORKLOADS:
        return WORKLOADS[name]
    if ":" not in name:
        raise InvalidInput(
            f"unknown workload {name!r}; built-in: {', '.join(sorted(WORKLOADS))}; a kernel "
            "of your own is named 'package.module:QualName'"
        )
    found = load_ref(name)
    if isinstance(found, type) and issubclass(found, Workload):
        if missing := _abstract_methods(found):
            raise InvalidInput(f"{name} must define {missing}")
        found = found()
    if not isinstance(found, Workload):
        raise InvalidInput(f"{name!r} is {type(found).__name__}, not a Workload subclass")
    return found


def _abstract_methods(cls: type[Workload]) -> str:
    """What ``cls`` leaves abstract, as ``"flops() and reference() (abstract in
    workloads.base.Workload)"``, or ``""`` when it can be instantiated."""
    names = sorted(getattr(cls, "__abstractmethods__", ()))
    if not names:
        return ""
    owners = dict.fromkeys(
        f"{owner.__module__}.{owner.__qualname__}"
        for owner in cls.__mro__
        for method in names
        if getattr(owner.__dict__.get(method), "__isabstractmethod__", False)
    )
    listed = [f"{method}()" for method in names]
    methods = listed[0] if len(listed) == 1 else f"{', '.join(listed[:-1])} and {listed[-1]}"
    return f"{methods} (abstract in {', '.join(owners)})"


__all__ = ["WORKLOADS", "Workload", "get_workload"]
