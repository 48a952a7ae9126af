"""Interpreter start with ``TUNECACHE_TRITON_AUTOTUNE`` set: route ``triton.autotune`` through
tunecache the moment the program imports Triton.

``tunecache-triton.pth``, installed beside the packages, imports this module only when the
variable is set and not off (``0``, ``false``, ``off``, ``no``, ``n``, as :mod:`tunecache.settings`
reads it), so a start without it costs one environment lookup; this module reads no variable
itself. It is the standard library only (``logging`` only to say what went wrong): it imports
neither Triton nor tunecache. It puts a finder first on
``sys.meta_path`` that, when ``triton`` is imported (a library's ``import triton``, usually), lets
the other finders load it and then, before the importing library decorates its first kernel,
calls :func:`tunecache.triton.install.install_from_env`. A lookup that does not import (torch and
transformers call ``importlib.util.find_spec("triton")``) leaves the finder in place. Whatever
goes wrong — a bad setting, tunecache not importable — is one line on stderr, and Triton stays
as it is: a start-up hook must never break the program.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # no typing import at start-up: a few milliseconds in every process
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import ModuleType
    from typing import Any

VARIABLE = "TUNECACHE_TRITON_AUTOTUNE"  # read by the .pth line (off values never import this)
TRITON = "triton"


def arm() -> None:
    """Routes ``triton.autotune`` now if Triton is imported, else when it is; once per process
    (``site`` may process a ``.pth`` file twice)."""
    try:
        if any(isinstance(finder, _ThenInstall) for finder in sys.meta_path):
            return
        if TRITON in sys.modules:
            _install()
        else:
            sys.meta_path.insert(0, _ThenInstall(_install))
    except BaseException as exc:  # a start-up hook: whatever went wrong, the program runs
        _say(exc)


def _install() -> None:
    try:
        from tunecache.triton.install import install_from_env

        install_from_env()
    except BaseException as exc:  # the program runs, with Triton's own autotuner
        _say(exc)


def _say(exc: BaseException) -> None:
    import logging  # only when something went wrong: a start stays free of it

    why = str(exc) if type(exc).__name__ in ("InvalidInput", "ValueError") else (
        f"{type(exc).__name__}: {exc}")  # fmt: skip
    logging.getLogger("tunecache.triton").warning(
        "tunecache: %s: %s; triton.autotune is left as it is", VARIABLE, why
    )


class _ThenInstall:  # a meta path finder (no importlib.abc: it imports typing)
    """Finds ``triton`` as the finders after it would, and has ``then`` run after its package."""

    def __init__(self, then: Callable[[], None]) -> None:
        self._then = then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> Any:
        if fullname != TRITON:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = None if finder is self or find is None else find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Then(spec.loader, self._done)
                return spec
        return None

    def _done(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # loaded: the rest of the process imports as usual
            self._then()


class _Then:  # a loader
    """A module's own loader, then ``then``; everything else asked of it goes to that loader."""

    def __init__(self, loader: Any, then: Callable[[], None]) -> None:
        self._loader, self._then = loader, then

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._then()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


arm()
