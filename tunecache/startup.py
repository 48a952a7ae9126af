"""Interpreter start with ``TUNECACHE_TRITON_AUTOTUNE=1``: route ``triton.autotune`` once Triton
is imported.

``tunecache-triton.pth``, installed beside the packages, imports this module only when the
variable is set (otherwise a start costs one environment lookup). :func:`arm` does not import
Triton: it waits for the process's own ``import triton`` (a library's, usually) and calls
:func:`tunecache.triton.install` with the environment's :class:`~tunecache.settings.Routing` the
moment Triton's package has run, before the importing library decorates its first kernel. A bad
setting, or a failure of its own, is one line on stderr and leaves Triton as it is: a start-up
hook must never break the user's program.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from tunecache.errors import InvalidInput
from tunecache.settings import AUTOTUNE_VAR, Routing, autotune_enabled

TRITON = "triton"
_armed = False


def arm() -> None:
    """Installs tunecache's ``autotune`` now if Triton is imported, else when it is. Once per
    process (``site`` may process a ``.pth`` file twice)."""
    global _armed
    if _armed:
        return
    _armed = True
    try:
        if not autotune_enabled():
            return
        routing = Routing.from_env()
    except (ValueError, InvalidInput) as exc:
        _say(f"{exc}; triton.autotune is left as it is")
        return
    if TRITON in sys.modules:
        _install(routing)
    else:
        sys.meta_path.insert(0, _ThenInstall(lambda: _install(routing)))


def _install(routing: Routing) -> None:
    try:
        from tunecache.triton.install import install

        install(routing)
    except Exception as exc:  # a start-up hook: whatever went wrong, the program runs
        _say(f"could not route triton.autotune ({type(exc).__name__}: {exc}); it is left as "
             "it is")  # fmt: skip


def _say(message: str) -> None:
    print(f"tunecache: {AUTOTUNE_VAR}: {message}", file=sys.stderr)


class _ThenInstall(importlib.abc.MetaPathFinder):
    """Finds ``triton`` as the finders after it would, and runs ``then`` after its package."""

    def __init__(self, then: Callable[[], None]) -> None:
        self._then = then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TRITON:
            return None
        sys.meta_path.remove(self)  # once: the rest of the process imports as usual
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None and spec.loader is not None:
                spec.loader = _Then(spec.loader, self._then)
                return spec
        return None


class _Then(importlib.abc.Loader):
    """A module's own loader, then ``then``; everything else asked of it goes to that loader."""

    def __init__(self, loader: Any, then: Callable[[], None]) -> None:
        self._loader, self._then = loader, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._then()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
