"""Triton kernels' best configs, shared through Inductor's ``RemoteAutotuneCache``.

When ``torch._inductor.config.autotune_remote_cache`` is on, Inductor asks
``torch._inductor.remote_cache.RemoteAutotuneCache`` for each generated Triton kernel's best
config before benchmarking its configs, and puts the winner there afterwards. The cache's class
attribute ``backend_override_cls`` replaces its Redis backend with any
``RemoteCacheBackend[bytes]``; :func:`backend_class` makes one that answers from the team cache
(namespace ``inductor.autotune``, the cache's own key, the config as a JSON object).

Values are untrusted: :func:`sanitise_best_config` keeps a config only if it looks like what
Inductor's ``AutotuneCache.save`` writes (``num_warps``, ``num_stages``, ``configs_hash`` and
scalar kernel arguments). Inductor compares ``configs_hash`` with the kernel's own, so a config
saved for another kernel is ignored by Inductor itself.

Inductor makes Triton kernels only for GPUs (on CPU it generates C++), so this path runs end to
end on a CUDA machine only. The override lives in this process: Triton kernels that Inductor
compiles in its worker processes (``compile_threads`` > 1, the default on a many-core machine) do
not see it; the workers log that no remote cache can be made and autotune as usual, and their
results are not recorded. ``torch._inductor.config.compile_threads = 1`` makes every kernel go
through this process (``tune --torch`` does so on CUDA).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from tunecache.inductor.remote import TeamCache

logger = logging.getLogger(__name__)

NAMESPACE: Final = "inductor.autotune"
MAX_KEY = 256
MAX_FIELDS = 64
MAX_STRING = 256
MAX_RECORDED = 10_000
_REQUIRED_INTS = {"num_warps": (1, 64), "num_stages": (0, 32)}


def _scalar(value: Any) -> bool:
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return abs(value) < 2**63
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) and len(value) <= MAX_STRING


def sanitise_best_config(value: Any) -> dict[str, Any] | None:
    """``value`` if it is a well-formed best config, else ``None``.

    Example:
        >>> sanitise_best_config({"XBLOCK": 128, "num_warps": 4, "num_stages": 1,
        ...                       "configs_hash": "ab12"})["XBLOCK"]
        128
        >>> sanitise_best_config({"XBLOCK": 128, "num_warps": "four", "num_stages": 1,
        ...                       "configs_hash": "ab12"}) is None
        True
    """
    if not isinstance(value, Mapping) or not 0 < len(value) <= MAX_FIELDS:
        return None
    for name, (low, high) in _REQUIRED_INTS.items():
        number = value.get(name)
        if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= high:
            return None
    configs_hash = value.get("configs_hash")
    if not isinstance(configs_hash, str) or not 0 < len(configs_hash) <= MAX_STRING:
        return None
    for name, field_value in value.items():
        if not isinstance(name, str) or not 0 < len(name) <= MAX_STRING:
            return None
        if name == "extra_options" and isinstance(field_value, Mapping):
            nested = field_value
            if len(nested) > MAX_FIELDS or not all(
                isinstance(k, str) and _scalar(v) for k, v in nested.items()
            ):
                return None
        elif not _scalar(field_value):
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
            found = self.team.fetch(NAMESPACE, key=name)
            value = sanitise_best_config(found[0].value) if found else None
            if found and value is None:
                logger.info("ignored a malformed best config for %s from the team cache", name)
            self._memo[name] = value
        value = self._memo[name]
        return None if value is None else _encode(value)

    def put(self, key: str, data: Any) -> None:
        """Records what Inductor saves; malformed data is dropped with a log line."""
        try:
            value = json.loads(data)
        except (TypeError, ValueError):
            value = None
        clean = sanitise_best_config(value)
        if clean is None:
            logger.info("not recording a best config that is not one: %r", data)
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


def install(store: AutotuneStore) -> None:
    """Makes Inductor's autotune remote cache ``store``, and turns that cache on."""
    from torch._inductor import config
    from torch._inductor.remote_cache import RemoteAutotuneCache

    RemoteAutotuneCache.backend_override_cls = backend_class(store)
    if hasattr(config, "autotune_remote_cache"):
        config.autotune_remote_cache = True


@contextlib.contextmanager
def installed(store: AutotuneStore) -> Iterator[AutotuneStore]:
    """:func:`install` for the body only; the previous backend and setting come back after."""
    from torch._inductor import config
    from torch._inductor.remote_cache import RemoteAutotuneCache

    previous = RemoteAutotuneCache.backend_override_cls
    had_setting = hasattr(config, "autotune_remote_cache")
    setting = getattr(config, "autotune_remote_cache", None)
    install(store)
    try:
        yield store
    finally:
        RemoteAutotuneCache.backend_override_cls = previous
        if had_setting:
            config.autotune_remote_cache = setting
