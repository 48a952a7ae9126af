"""The one environment variable the Triton backend reads.

- ``TRITON_INTERPRET``: ``1`` (or ``true``, ``on``, ``yes``, ``y``) runs Triton kernels in Triton's
  CPU interpreter (numpy) instead of compiling them for a GPU; unset, empty or ``0`` (``false``,
  ``off``, ``no``, ``n``) compiles them. Triton itself reads the variable when a function is
  decorated with ``@triton.jit`` (``triton.knobs.runtime.interpret`` in 3.6 and 3.9), so it must be
  set before a kernel is jitted; :mod:`backends.triton.jit` defers that to the first launch.
  Interpreter timings are meaningless: it is for correctness only.

A bad value raises :class:`ValueError` naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

INTERPRET_VAR = "TRITON_INTERPRET"
_TRUE = frozenset({"1", "true", "on", "yes", "y"})
_FALSE = frozenset({"", "0", "false", "off", "no", "n"})


def interpret_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's CPU interpreter (``os.environ`` by default).

    Raises:
        ValueError: the variable is set to something that is neither true nor false.
    """
    env = os.environ if environ is None else environ
    raw = env.get(INTERPRET_VAR, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"{INTERPRET_VAR}={env.get(INTERPRET_VAR)!r} is not 1/true/on or 0/false/off")
