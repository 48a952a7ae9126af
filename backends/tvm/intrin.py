"""Registering only the CPU tensor intrinsics, instead of all of them (~20 s saved per process).

MetaSchedule's ``TuneContext`` runs ``import tvm.s_tir.tensor_intrin``, whose ``__init__`` builds
every intrinsic TVM ships: the CUDA ones alone take ~18 s to import on a 2-core machine. An llvm
target needs only the x86 dot-product intrinsics (``dot_16x4_vnni``, ``dot_16x4_avx512``) that
MetaSchedule's x86 schedule rules name. While :func:`cpu_intrinsics_only` is active the package
is a stub that has imported just ``x86``; on exit the stub goes, so a later plain import (a CUDA
tune in the same process) still runs the real ``__init__`` and registers the rest (``x86`` stays
in ``sys.modules`` and is not registered twice).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import sys
import types
from collections.abc import Iterator

logger = logging.getLogger(__name__)

_PACKAGE = "tvm.s_tir.tensor_intrin"


@contextlib.contextmanager
def cpu_intrinsics_only() -> Iterator[None]:
    """Within the block, ``import tvm.s_tir.tensor_intrin`` registers only the x86 intrinsics.

    Does nothing when the real package has already been imported. Not thread-safe: another
    thread importing the package inside the block sees the stub.
    """
    if _PACKAGE in sys.modules:
        yield
        return
    import tvm.s_tir

    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or spec.submodule_search_locations is None:  # pragma: no cover
        yield
        return
    stub = types.ModuleType(_PACKAGE, "CPU-only stand-in for tvm.s_tir.tensor_intrin")
    stub.__path__ = list(spec.submodule_search_locations)
    stub.__package__ = _PACKAGE
    sys.modules[_PACKAGE] = stub
    try:
        importlib.import_module(f"{_PACKAGE}.x86")
        yield
    finally:
        if sys.modules.get(_PACKAGE) is stub:
            del sys.modules[_PACKAGE]
        if getattr(tvm.s_tir, "tensor_intrin", None) is stub:
            delattr(tvm.s_tir, "tensor_intrin")
