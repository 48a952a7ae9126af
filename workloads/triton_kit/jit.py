"""``@lazy_jit``: ``@triton.jit`` deferred to the first launch.

``triton.jit`` decides at decoration time whether a kernel is compiled for a GPU or run by the CPU
interpreter (it reads ``TRITON_INTERPRET`` then, in 3.6 as in 3.9), and Triton's own jit helpers
(``tl.sum``, ``tl.max``, ``tl.cdiv``) were decided the same way when ``triton.language`` was first
imported. A kernel works only when both agree. Decorating at import would fix each workload's
kernels to whatever the variable was when something first asked for its space or default config;
a :class:`LazyKernel` jits at its first launch instead (once per setting), checks that Triton
itself was imported in the same mode (:func:`mode_mismatch`) and otherwise behaves like the jitted
function: ``kernel[grid](*args, BLOCK=..., num_warps=..., num_stages=...)``. So the interpreter
must still be chosen before the first ``import triton`` of the process.

Example:
    >>> import triton.language as tl
    >>> @lazy_jit
    ... def add_one(x_ptr, n, BLOCK: tl.constexpr):
    ...     offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ...     tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)
    >>> add_one[(1,)](x, x.numel(), BLOCK=16)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from tunecache.settings import INTERPRET_VAR, interpret_enabled


def mode_mismatch() -> str | None:
    """Why kernels cannot be jitted in the current ``TRITON_INTERPRET`` mode, or ``None``.

    They cannot when Triton's standard library was imported in the other mode (checked on
    ``tl.standard.cdiv``, a ``@jit`` helper in Triton 3.6 and 3.9).
    """
    import triton
    import triton.language as tl

    compiled = isinstance(tl.standard.cdiv, triton.runtime.JITFunction)
    interpret = interpret_enabled()
    if interpret and compiled:
        return (
            f"{INTERPRET_VAR}=1 was set after triton was imported without it: Triton's own jit "
            f"helpers (tl.sum, tl.cdiv) are GPU-only in this process; set {INTERPRET_VAR}=1 "
            "before the first `import triton` (in the environment or a conftest.py)"
        )
    if not interpret and not compiled:
        return (
            f"triton was imported with {INTERPRET_VAR}=1 but it is no longer set: Triton's own "
            "jit helpers only run in the interpreter in this process"
        )
    return None


@contextlib.contextmanager
def compile_only() -> Iterator[list[Any]]:
    """Inside the block, every Triton kernel launch of this process compiles its kernel (through
    the ``JITFunction.run`` a launch takes, so with the same specialisation and cache key) and
    launches nothing; the compiled kernels are appended to the list it yields.

    That holds for a :class:`LazyKernel` and for a library's plain ``@triton.jit`` kernel launched
    by the library's own code (vLLM's fused-MoE kernel): ``JITFunction.run`` itself is replaced
    for the block, so it is for a process that only compiles (the compile farm's), not one that
    launches kernels on other threads meanwhile; blocks on several threads take turns.
    """
    from triton.runtime.jit import JITFunction

    compiled: list[Any] = []
    with _PATCHING:
        launch = JITFunction.run

        def compile_instead(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            kernel = launch(self, *args, grid=grid, warmup=True, **kwargs)
            if kernel is not None:  # None: a jit_cache_hook took the compile over
                compiled.append(kernel)
            return kernel

        JITFunction.run = compile_instead
        try:
            yield compiled
        finally:
            JITFunction.run = launch


_PATCHING = threading.RLock()


class LazyKernel:
    """A Python function that becomes a Triton kernel on its first launch."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = fn.__doc__
        self._jitted: dict[bool, Any] = {}

    def jit(self) -> Any:
        """The ``triton.jit`` function for the current ``TRITON_INTERPRET`` setting.

        Raises:
            RuntimeError: Triton was imported in the other mode (see :func:`mode_mismatch`).
        """
        interpret = interpret_enabled()
        found = self._jitted.get(interpret)
        if found is None:
            import triton

            if (reason := mode_mismatch()) is not None:
                raise RuntimeError(f"cannot jit {self.__name__}: {reason}")
            found = self._jitted[interpret] = triton.jit(self.fn)
        return found

    def __getitem__(self, grid: Any) -> Any:
        return self.jit()[grid]

    def __repr__(self) -> str:
        return f"LazyKernel({self.__name__})"


def lazy_jit(fn: Callable[..., Any]) -> LazyKernel:
    """Decorates a kernel like ``@triton.jit``, jitting it when it is first launched."""
    return LazyKernel(fn)
