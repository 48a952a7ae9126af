"""tunecache for any Triton kernel: ``tunecache.triton.autotune`` replaces ``triton.autotune``;
``tunecache.triton.install()`` (or ``TUNECACHE_TRITON_AUTOTUNE=1``) routes every one in the process.

Importing this module imports Triton (the rest of :mod:`tunecache` does not).

Example:
    >>> import tunecache.triton
    >>> @tunecache.triton.autotune(configs=[...], key=["n"])  # doctest: +SKIP
    ... @triton.jit
    ... def kernel(x_ptr, n, BLOCK: tl.constexpr): ...
"""

from __future__ import annotations

from tunecache.settings import Routing
from tunecache.triton.autotuner import CachedAutotuner, autotune
from tunecache.triton.install import install, installed, routed, uninstall
from tunecache.triton.keys import KernelIdentity, KernelSpace, key_of_call, launch_misfit, misfit

__all__ = [
    "CachedAutotuner",
    "KernelIdentity",
    "KernelSpace",
    "Routing",
    "autotune",
    "install",
    "installed",
    "key_of_call",
    "launch_misfit",
    "misfit",
    "routed",
    "uninstall",
]
