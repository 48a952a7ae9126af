"""The llvm target for this CPU, and the identity of a (target, TVM version) pair.

Without ``mcpu`` LLVM compiles for generic x86-64 (SSE2 only), so the host CPU name is asked of
TVM's own LLVM and added to the target: then AVX2 / AVX-512 are used where the CPU has them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from tunecache.device import host_cores
from tunecache.tvm.jsonutil import plain_json

logger = logging.getLogger(__name__)

# CPU names LLVM reports when it cannot tell; passing them as mcpu adds nothing.
_GENERIC_CPUS = frozenset({"", "generic", "x86-64", "unknown"})


@functools.cache
def host_target() -> dict[str, Any]:
    """The llvm target for this machine: ``{"kind": "llvm", "num-cores": N, "mcpu": ...}``.

    ``mcpu`` is left out when TVM's LLVM cannot name the host CPU or does not know the name.
    """
    from tvm.target import codegen

    target: dict[str, Any] = {"kind": "llvm", "num-cores": host_cores()}
    cpu = str(codegen.llvm_get_system_cpu())
    if cpu not in _GENERIC_CPUS:
        try:
            valid = bool(codegen.llvm_is_valid_cpu(cpu, str(codegen.llvm_get_system_triple())))
        except Exception:  # older/other LLVM builds: trust the name LLVM itself reported
            valid = True
        if valid:
            target["mcpu"] = cpu
        else:
            logger.warning("LLVM does not know host CPU %r; compiling for generic x86-64", cpu)
    return target


def canonical_target(target: Mapping[str, Any]) -> dict[str, Any]:
    """``target`` as TVM normalises it (``keys``, ``tag`` filled in), as plain JSON data."""
    from tvm.target import Target

    exported: dict[str, Any] = plain_json(Target(dict(target)).export())
    return exported


def tvm_version() -> str:
    """The installed TVM's version (``0.27.0.post1``)."""
    import tvm

    return str(tvm.__version__)


def partition_name(target: Mapping[str, Any]) -> str:
    """``<sha256(target json)[:16]>-tvm<version>``: one database per (target, TVM version).

    MetaSchedule's database ignores the target when it looks records up, so records tuned for
    one CPU (or one TVM release) must live apart from the others.
    """
    text = json.dumps(canonical_target(target), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"{digest}-tvm{tvm_version()}"
