"""tunecache for any Triton kernel: ``tunecache.triton.autotune`` replaces ``triton.autotune``.

Importing this module imports Triton (the rest of :mod:`tunecache` does not).

Example:
    >>> import tunecache.triton
    >>> @tunecache.triton.autotune(configs=[...], key=["n"])  # doctest: +SKIP
    ... @triton.jit
    ... def kernel(x_ptr, n, BLOCK: tl.constexpr): ...
"""

from __future__ import annotations

from tunecache.triton.autotuner import CachedAutotuner, autotune
from tunecache.triton.keys import KernelIdentity, KernelSpace, key_of_call, launch_misfit, misfit

__all__ = [
    "CachedAutotuner",
    "KernelIdentity",
    "KernelSpace",
    "autotune",
    "key_of_call",
    "launch_misfit",
    "misfit",
]
