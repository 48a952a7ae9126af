"""``tunecache.triton.install()``: every ``triton.autotune`` of the process through tunecache.

Libraries decorate their kernels with ``@triton.autotune`` at import, and their users cannot edit
them. :func:`install` replaces ``triton.autotune`` (as ``triton``, ``triton.runtime`` and
``triton.runtime.autotuner`` export it) with a function of the same signature that, for a kernel
defined in a module the :class:`~tunecache.settings.Routing` takes, builds
:class:`~tunecache.triton.autotuner.CachedAutotuner` instead of Triton's ``Autotuner``: hits
launch with no benchmark, misses tune or launch the first config as configured, every rank runs
the config the first rank to reach a key decided (:mod:`tunecache.triton.ranks`), and a served
config launches only when it is one of the kernel's own listed configs (its space). Kernels of
other modules get Triton's own autotuner, untouched.

Only kernels decorated after :func:`install` are routed: call it before importing the library,
or set ``TUNECACHE_TRITON_AUTOTUNE=1`` (the start-up hook, ``_tunecache_triton_hook``, installs it
the moment the program imports Triton).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import triton
import triton.runtime
import triton.runtime.autotuner

from tunecache.settings import Routing, autotune_enabled
from tunecache.triton.autotuner import CachedAutotuner, autotune
from tunecache.triton.keys import base_function

logger = logging.getLogger(__name__)
_EXPORTS = (triton, triton.runtime, triton.runtime.autotuner)
_ORIGINAL: dict[str, Callable[..., Any]] = {}  # Triton's own autotune, while installed
_ROUTED: list[CachedAutotuner] = []


def install(routing: Routing | None = None) -> None:
    """Routes ``triton.autotune`` through tunecache for the kernels ``routing`` takes (default:
    :meth:`Routing.from_env`, every module unless the environment narrows it). Installing again
    replaces the routing."""
    routing = Routing.from_env() if routing is None else routing
    original = _ORIGINAL.setdefault("autotune", triton.runtime.autotuner.autotune)
    routed = _routed_autotune(original, routing)
    for module in _EXPORTS:
        module.autotune = routed
    logger.info("tunecache.triton: triton.autotune routed through tunecache (%s)", routing)


def install_from_env() -> bool:
    """:func:`install` as the environment asks (``TUNECACHE_TRITON_AUTOTUNE`` and the routing's
    variables): the start-up hook's call. Whether it installed.

    Raises:
        ValueError, InvalidInput: a variable's value is not one it takes (the message names it).
    """
    if not autotune_enabled():
        return False
    install(Routing.from_env())
    return True


def uninstall() -> None:
    """Gives ``triton.autotune`` back to Triton (kernels already routed stay routed)."""
    original = _ORIGINAL.pop("autotune", None)
    if original is not None:
        for module in _EXPORTS:
            module.autotune = original


def installed() -> bool:
    """Whether ``triton.autotune`` is routed now (by :func:`install` or the start-up hook)."""
    return "autotune" in _ORIGINAL


def routed() -> list[CachedAutotuner]:
    """The kernels routed through tunecache in this process, in the order they were decorated
    (each counts the tuning keys Triton benchmarked: ``benchmarked``)."""
    return list(_ROUTED)


def _routed_autotune(original: Callable[..., Any], routing: Routing) -> Callable[..., Any]:
    signature = inspect.signature(original)

    def routed_autotune(*args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        try:
            given = signature.bind(*args, **kwargs).arguments
        except TypeError:
            return original(*args, **kwargs)  # Triton's own error, as without tunecache
        configs, key = given.pop("configs"), given.pop("key")

        def decorator(fn: Any) -> Any:
            module = getattr(base_function(fn), "__module__", None) or ""
            if not routing.routes(module) or len(configs) < 2:
                return original(*args, **kwargs)(fn)
            kernel = autotune(configs, key, on_miss=routing.on_miss,  # type: ignore[arg-type]
                              policy=routing.policy, verify=routing.verify,  # type: ignore[arg-type]
                              **given)(fn)  # fmt: skip
            _ROUTED.append(kernel)
            return kernel

        return decorator

    routed_autotune.__doc__ = original.__doc__
    routed_autotune.__wrapped__ = original  # type: ignore[attr-defined]
    return routed_autotune
