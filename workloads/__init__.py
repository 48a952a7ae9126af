"""Built-in workloads, by name.

Example:
    >>> from workloads import get_workload
    >>> get_workload("matmul").params
    ('M', 'N', 'K')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tunecache.device import DeviceFingerprint, local_fingerprint
from tunecache.environment import environment_for
from tunecache.errors import InvalidInput
from tunecache.key import Key
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
    """The workload called ``name``.

    Raises:
        InvalidInput: no workload has that name (the message lists those that exist).
    """
    try:
        return WORKLOADS[name]
    except KeyError:
        raise InvalidInput(
            f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}"
        ) from None


def make_key(
    workload: str | Workload,
    backend: str,
    problem: Mapping[str, Any],
    dtype: str,
    device: DeviceFingerprint | None = None,
) -> Key:
    """The cache key of a built-in workload on this machine (or on ``device``).

    Raises:
        InvalidInput: unknown workload, backend, dtype, or a malformed problem.
    """
    w = get_workload(workload) if isinstance(workload, str) else workload
    w.check_backend(backend)
    w.check_dtype(dtype, backend)
    return Key(
        kernel=w.name,
        source_hash=w.source_hash(backend),
        backend=backend,
        problem=w.problem(problem),
        dtype=dtype,
        device=device or local_fingerprint("cpu"),
        environment=environment_for(backend),
    )


__all__ = ["WORKLOADS", "Workload", "get_workload", "make_key"]
