"""Tuning backends by name; each imports its heavy framework only when used."""

from __future__ import annotations

import importlib

from backends.base import (
    Backend,
    Budget,
    CompilesAhead,
    Progress,
    ProgressFn,
    Runnable,
    SearchRequest,
    SearchResult,
    Target,
    Trial,
    compile_target,
)
from tunecache.errors import lookup
from tunecache.kernels import BACKENDS

# name -> "module:Class"; modules are imported on first use so `import backends` stays light.
_REGISTRY: dict[str, str] = {
    "tvm": "backends.tvm:TVMBackend",
    "inductor": "backends.inductor:InductorBackend",
    "triton": "backends.triton:TritonBackend",
}
assert set(_REGISTRY) == set(BACKENDS), "one list of backend names: tunecache.kernels.BACKENDS"


def get_backend(name: str) -> Backend:
    """A fresh instance of the backend called ``name``.

    Raises:
        InvalidInput: no backend has that name.
    """
    module, _, cls = lookup(_REGISTRY, name, "backend").partition(":")
    backend: Backend = getattr(importlib.import_module(module), cls)()
    return backend


def backend_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


__all__ = [
    "Backend",
    "Budget",
    "CompilesAhead",
    "Progress",
    "ProgressFn",
    "Runnable",
    "SearchRequest",
    "SearchResult",
    "Target",
    "Trial",
    "backend_names",
    "compile_target",
    "get_backend",
]
