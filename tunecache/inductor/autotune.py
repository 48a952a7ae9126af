"""Triton kernels' best configs, shared through Inductor's ``RemoteAutotuneCache``.

When ``torch._inductor.config.autotune_remote_cache`` is on, Inductor asks
``torch._inductor.remote_cache.RemoteAutotuneCache`` for each generated Triton kernel's best
config before benchmarking its configs, and puts the winner there afterwards. The cache's class
attribute ``backend_override_cls`` replaces its Redis backend with any
``RemoteCacheBackend[bytes]``; :func:`backend_class` makes one that answers from the team cache
(namespace ``inductor.autotune``, the cache's own key, the config as a JSON object).

Values are untrusted: :func:`sanitise_best_config` keeps a config only if it fits the closed
schema the server also checks at upload
(:func:`tunecache.configcheck.inductor.best_config_problem`): what Inductor's
``AutotuneCache.save`` writes when it selected one of the kernel's listed configs (``num_warps``,
``num_stages``, ``configs_hash``, numeric kernel arguments), never ``found_by_coordesc: true`` or
``extra_options``. Inductor compares ``configs_hash`` with the kernel's own, so a config saved for
another kernel is ignored by Inductor itself.

**Only the kernel's own configs.** Inductor (torch 2.13) *rebuilds* a cached best config that
matches none of the kernel's listed configs and launches it ("dynamically added configs"). While
the store is installed, ``AutotuneCache.read_best`` is guarded (:func:`install_guard`): a best
config the team cache answered must carry the kernel's own ``configs_hash`` and select exactly
one of its listed configs (same arguments, ``num_warps`` and ``num_stages``; another hash,
recorded, was rebuilt from its values on a machine whose kernel lists other configs), else the
store answers a miss with one warning and
Inductor benchmarks as usual. The store drops it, not the guard after the read: Inductor records
what its remote cache answers as a cache artifact (``torch.compiler.save_cache_artifacts``), and
an artifact loaded elsewhere becomes a local best config it would launch. A config Inductor
returns that is not one of the listed objects is dropped by the guard too. What Inductor's own
local cache answers is left as it was. A torch whose
``AutotuneCache`` has no ``read_best(self, inductor_meta, configs)`` runs unguarded (a debug
line); torch 2.11's ``_load_cached_autotuning`` rebuilds only ``found_by_coordesc`` configs,
which the schema refuses.

Inductor makes Triton kernels only for GPUs (on CPU it generates C++), so this path runs end to
end on a CUDA machine only. The override lives in this process: Triton kernels that Inductor
compiles in its worker processes (``compile_threads`` > 1, the default on a many-core machine) do
not see it; the workers log that no remote cache can be made and autotune as usual, and their
results are not recorded. ``torch._inductor.config.compile_threads = 1`` makes every kernel go
through this process (``tune --torch`` does so on CUDA).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import inspect
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from tunecache.configcheck.inductor import best_config_problem
from tunecache.inductor.remote import TeamCache
from tunecache.jsonsafe import parse_json
from tunecache.ranks import shared_artifacts

logger = logging.getLogger(__name__)

NAMESPACE: Final = "inductor.autotune"
MAX_KEY = 256
MAX_RECORDED = 10_000
_GUARD: Final = "__tunecache_original__"  # on the guarded read_best: the method it wraps
_READ_BEST_PARAMS: Final = ("self", "inductor_meta", "configs")


@dataclass
class _Read:
    """A guarded ``read_best`` in progress: the kernel's listed configs, and the keys the team
    cache answered for it."""

    configs: list[Any]
    configs_hash: Any = None
    answered: list[str] = field(default_factory=list)


# Set by the guarded read_best while it runs: the store checks its answers against the listed
# configs there, and notes the keys it answered.
_reading: contextvars.ContextVar[_Read | None] = contextvars.ContextVar(
    "tunecache_autotune_reading", default=None
)
_warned = False


def sanitise_best_config(value: Any) -> dict[str, Any] | None:
    """``value`` if it is a best config that may be served, else ``None`` (a debug line says why).

    Example:
        >>> sanitise_best_config({"XBLOCK": 128, "num_warps": 4, "num_stages": 1,
        ...                       "configs_hash": "ab12"})["XBLOCK"]
        128
        >>> sanitise_best_config({"XBLOCK": 128, "num_warps": "four", "num_stages": 1,
        ...                       "configs_hash": "ab12"}) is None
        True
    """
    if (why := best_config_problem(value)) is not None:
        logger.debug("best config refused: %s", why)
        return None
    return dict(value)


def artifact_key(key: str) -> str:
    """The artifact key of a remote cache key: itself when it fits the server's 256, else hashed."""
    if 0 < len(key) <= MAX_KEY and key.isprintable():
        return key
    return f"sha256:{hashlib.sha256(key.encode('utf-8', 'replace')).hexdigest()}"


@dataclass
class AutotuneStore:
    """What the backend answers and records.

    Attributes:
        team: the team cache to read from, or ``None`` (record only).
        read: whether reads ask ``team`` (``tune --torch`` records without reading).
        recorded: artifact key → best config put by Inductor in this process (to upload).
    """

    team: TeamCache | None
    read: bool = True
    recorded: dict[str, dict[str, Any]] = field(default_factory=dict)
    _memo: dict[str, dict[str, Any] | None] = field(default_factory=dict)

    def get(self, key: str) -> bytes | None:
        """The best config of ``key`` as JSON bytes, or ``None`` (miss, failure, bad value)."""
        name = artifact_key(key)
        if name in self.recorded:
            return _encode(self.recorded[name])
        if not self.read or self.team is None:
            return None
        if name not in self._memo:
            team = self.team  # one rank reads for all (tunecache.ranks): the same kernels
            found = shared_artifacts(lambda: team.fetch(NAMESPACE, key=name), NAMESPACE,
                                     team.partition, name) or []  # fmt: skip
            value = sanitise_best_config(found[0].value) if found else None
            if found and value is None:
                why = best_config_problem(found[0].value)
                logger.info("ignored a best config for %s from the team cache: %s", name, why)
            self._memo[name] = value
        value = self._memo[name]
        if value is None:
            return None
        if (reading := _reading.get()) is not None:
            if (value.get("configs_hash") != reading.configs_hash
                    or not selects_one(value, reading.configs)):  # fmt: skip
                _drop([name], value)  # before Inductor sees it: it records what it is answered
                return None
            reading.answered.append(name)
        return _encode(value)

    def put(self, key: str, data: Any) -> None:
        """Records what Inductor saves; malformed data is dropped with a log line."""
        try:
            value = parse_json(data)
        except (TypeError, ValueError):
            value = None
        clean = sanitise_best_config(value)
        if clean is None:
            why = best_config_problem(value)
            logger.info("not recording a best config that may not be served (%s): %r", why, data)
            return
        if len(self.recorded) < MAX_RECORDED:
            self.recorded[artifact_key(key)] = clean


def _encode(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value).encode("ascii")


def backend_class(store: AutotuneStore) -> type[Any]:
    """A ``RemoteCacheBackend[bytes]`` subclass answering from ``store`` (made with no args)."""
    from torch._inductor.remote_cache import RemoteCacheBackend

    class TeamAutotuneBackend(RemoteCacheBackend[bytes]):
        """Inductor's autotune remote cache, backed by the tunecache server."""

        def _get(self, key: str) -> bytes | None:
            return store.get(key)

        def _put(self, key: str, data: bytes) -> None:
            store.put(key, data)

    return TeamAutotuneBackend


def selects_one(best: Mapping[str, Any], configs: Sequence[Any]) -> bool:
    """Whether ``best`` selects exactly one of ``configs`` as Inductor matches them (every
    argument of the listed config, its ``num_warps`` and its ``num_stages``): a best config that
    selects none or several, Inductor rebuilds from the values it was given and launches."""
    matching = [
        listed
        for listed in configs
        if all(value == best.get(name) for name, value in getattr(listed, "kwargs", {}).items())
        and getattr(listed, "num_warps", None) == best.get("num_warps")
        and getattr(listed, "num_stages", None) == best.get("num_stages")
    ]
    return len(matching) == 1


def _drop(keys: list[str], best: Any) -> None:
    global _warned
    log = logger.debug if _warned else logger.warning
    _warned = True
    log(
        "the team cache's best config for %s (%s) is none of the kernel's own "
        "configs; not used, Inductor autotunes this kernel",
        ", ".join(keys),
        best,
    )


def _guarded(original: Callable[..., Any]) -> Callable[..., Any]:
    """``AutotuneCache.read_best`` that keeps a team-cache answer only if it is a listed config."""

    @functools.wraps(original)
    def read_best(self: Any, inductor_meta: Any, configs: Any, *args: Any, **kwargs: Any) -> Any:
        reading = _Read(list(configs), getattr(self, "configs_hash", None))
        token = _reading.set(reading)
        try:
            best = original(self, inductor_meta, configs, *args, **kwargs)
        finally:
            _reading.reset(token)
        if best is None or not reading.answered:  # a miss, or Inductor's local cache answered
            return best
        if not any(best is listed for listed in reading.configs):  # matched otherwise than here
            _drop(reading.answered, best)
            return None
        return best

    setattr(read_best, _GUARD, original)
    return read_best


def _autotune_cache_class() -> type[Any] | None:
    try:
        from torch._inductor.runtime.autotune_cache import AutotuneCache
    except ImportError as exc:  # an Inductor without the autotune cache
        logger.debug("no AutotuneCache to guard (%s)", exc)
        return None
    return AutotuneCache


def install_guard() -> None:
    """Guards ``AutotuneCache.read_best`` (see the module docstring); idempotent.

    A torch whose ``AutotuneCache`` has no ``read_best(self, inductor_meta, configs)`` is left
    unguarded with a debug line.
    """
    cls = _autotune_cache_class()
    method = None if cls is None else cls.__dict__.get("read_best")
    if cls is None or method is None or hasattr(method, _GUARD):
        if cls is not None and method is None:
            logger.debug("AutotuneCache has no read_best in this torch: not guarded")
        return
    try:
        names = tuple(inspect.signature(method).parameters)[: len(_READ_BEST_PARAMS)]
    except (TypeError, ValueError):
        names = ()
    if not callable(method) or names != _READ_BEST_PARAMS:
        logger.debug("AutotuneCache.read_best%s is not the one guarded here: not guarded", names)
        return
    cls.read_best = _guarded(method)


def install(store: AutotuneStore) -> None:
    """Makes Inductor's autotune remote cache ``store``, turns that cache on, and guards reads."""
    from torch._inductor import config
    from torch._inductor.remote_cache import RemoteAutotuneCache

    RemoteAutotuneCache.backend_override_cls = backend_class(store)
    if hasattr(config, "autotune_remote_cache"):
        config.autotune_remote_cache = True
    install_guard()


@contextlib.contextmanager
def installed(store: AutotuneStore) -> Iterator[AutotuneStore]:
    """:func:`install` for the body only; the previous backend, setting and ``read_best`` after."""
    from torch._inductor import config
    from torch._inductor.remote_cache import RemoteAutotuneCache

    previous = RemoteAutotuneCache.backend_override_cls
    had_setting = hasattr(config, "autotune_remote_cache")
    setting = getattr(config, "autotune_remote_cache", None)
    cls = _autotune_cache_class()
    read_best = None if cls is None else cls.__dict__.get("read_best")
    install(store)
    try:
        yield store
    finally:
        RemoteAutotuneCache.backend_override_cls = previous
        if had_setting:
            config.autotune_remote_cache = setting
        if cls is not None and read_best is not None:
            cls.read_best = read_best
