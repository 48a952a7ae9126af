"""The one environment variable the Triton backend reads, ``TRITON_INTERPRET``.

It is read in :mod:`tunecache.settings` (keys need it too: under the interpreter a Triton kernel
runs on the CPU); Triton itself reads it when a function is decorated with ``@triton.jit``, so
it must be set before a kernel is jitted (:mod:`workloads.triton_kit.jit` defers that to the first
launch). Interpreter timings are meaningless: it is for correctness only.
"""

from __future__ import annotations

from tunecache.settings import INTERPRET_VAR, interpret_enabled

__all__ = ["INTERPRET_VAR", "interpret_enabled"]
