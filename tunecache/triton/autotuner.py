"""``tunecache.triton.autotune``: Triton's autotuner, fed from and feeding the shared cache.

:class:`CachedAutotuner` is a ``triton.runtime.autotuner.Autotuner`` that, before Triton would
benchmark a new tuning key, looks the call's :class:`~tunecache.Key` up (memo → snapshot file →
server). A hit that fits the kernel and the device goes into Triton's own per-key cache, so Triton
launches it with no benchmarking at all. A miss is tuned as Triton tunes (``on_miss="tune"``: the
listed configs benchmarked with Triton's ``do_bench``), the winner validated on fresh inputs and
uploaded when a write token is set; or the first config is launched and the miss reported
(``on_miss="default"``). With ``torch.distributed`` initialised, rank 0's choice is broadcast,
so every rank launches the same config.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from triton import Config
from triton.runtime.autotuner import Autotuner

from tunecache.client import Client
from tunecache.defaults import TOLERANCES
from tunecache.errors import InvalidInput, ServerError
from tunecache.key import Key
from tunecache.policies import VersionPolicy
from tunecache.settings import Settings
from tunecache.triton.keys import (
    KernelIdentity,
    call_device,
    key_of_call,
    misfit,
)
from tunecache.triton.record import (
    SEED,
    build_record,
    compare_outputs,
    config_json,
    fresh_arguments,
    validated,
)
from tunecache.triton.shared import shared_misfit

logger = logging.getLogger(__name__)
OnMiss = Literal["tune", "default"]


@functools.cache
def settings() -> Settings:
    """The environment's settings, read once; the defaults (one warning) when a variable is
    malformed: a bad ``TUNECACHE_*`` value must not break the user's import or launch."""
    try:
        return Settings.from_env()
    except ValueError as exc:
        logger.warning("tunecache.triton: %s; using the default settings", exc)
        return Settings()


@functools.cache
def shared_client(url: str | None, snapshot: Path | None, policy: VersionPolicy) -> Client:
    """One client per process and settings, shared by every decorated kernel."""
    found = settings()
    return Client(url or found.url, timeout=found.timeout, token=found.token or "",
                  snapshot=snapshot, policy=policy, report_misses=True)  # fmt: skip


def _launch_config(config: dict[str, Any]) -> Config:
    launch = {
        k: config[k] for k in ("num_warps", "num_stages", "num_ctas", "maxnreg") if k in config
    }
    meta = {k: v for k, v in config.items() if k not in launch}
    return Config(meta, **launch)


class CachedAutotuner(Autotuner):
    """A Triton autotuner whose per-key cache is filled from tunecache first."""

    def __init__(self, fn: Any, arg_names: list[str], configs: list[Config], key: list[str],
                 *, url: str | None, snapshot: Path | None, policy: VersionPolicy,
                 on_miss: OnMiss, reference: Callable[..., Any] | None,
                 **options: Any) -> None:  # fmt: skip
        reset_to_zero = options.pop("reset_to_zero", None)
        restore_value = options.pop("restore_value", None)
        super().__init__(fn, arg_names, configs, key, reset_to_zero, restore_value, **options)
        self.identity = KernelIdentity.of(fn)
        # The tuned meta-parameters and their types, as the listed configs give them.
        self.meta = {k: type(v) for c in configs for k, v in c.kwargs.items()}
        self.url, self.snapshot, self.policy = url, snapshot, policy
        self.on_miss, self.reference = on_miss, reference
        self.benchmarked = 0  # tuning keys Triton benchmarked in this process
        self._warned: set[str] = set()

    # -- the run ---------------------------------------------------------------------------
    def run(self, *args: Any, **kwargs: Any) -> Any:
        arguments = {**dict(zip(self.arg_names, args, strict=False)), **kwargs}
        tuning_key = self._triton_key(arguments)
        if len(self.configs) < 2 or tuning_key in self.cache:
            return super().run(*args, **kwargs)
        key = self._key(arguments)
        if key is not None:
            self._resolve(key, tuning_key, arguments)
        if _distributed() and self._rank() != 0:
            self.cache[tuning_key] = _launch_config(_broadcast(None))
            return super().run(*args, **kwargs)
        tuned = tuning_key not in self.cache
        started = time.perf_counter()
        out = super().run(*args, **kwargs)
        if tuned:
            self.benchmarked += 1
            if key is not None:
                self._tuned(key, tuning_key, args, kwargs, time.perf_counter() - started)
        if _distributed():
            _broadcast(config_json(self.cache[tuning_key]))
        return out

    def _triton_key(self, arguments: dict[str, Any]) -> tuple[Any, ...]:
        """The tuple Triton's own ``Autotuner.run`` caches under (key values, then dtypes)."""
        named = {k: v for k, v in arguments.items() if k in self.arg_names}
        values: list[Any] = [named[k] for k in self.keys if k in named]
        values += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
        return tuple(values)

    def _key(self, arguments: dict[str, Any]) -> Key | None:
        named = {k: v for k, v in arguments.items() if k in self.arg_names}
        try:
            return key_of_call(self.identity, self.keys, named)
        except InvalidInput as exc:
            self._warn_once("key", f"{exc}; tuning as Triton does, without the cache")
            return None

    def _client(self) -> Client:
        return shared_client(self.url, self.snapshot, self.policy)

    # -- hits and misses ---------------------------------------------------------------------
    def _resolve(self, key: Key, tuning_key: tuple[Any, ...], arguments: dict[str, Any]) -> None:
        """Fills Triton's cache for ``tuning_key`` from tunecache when a fitting config is found
        (or with the first config on a miss when ``on_miss="default"``)."""
        tensors = [v for v in arguments.values() if hasattr(v, "data_ptr")]
        device = call_device(tensors)

        named = {k: v for k, v in arguments.items() if k in self.arg_names}

        def fits(config: dict[str, Any]) -> str | None:
            why = misfit(config, self.identity, self.meta, device)
            return why or shared_misfit(self.fn, named, config, device)

        # A config that does not fit is passed over: the next source, else a miss.
        result = self._client().lookup(key, default=None, fits=fits)
        if result.hit and result.config is not None:
            self.cache[tuning_key] = _launch_config(result.config)
            return
        if self.on_miss == "default":
            self.cache[tuning_key] = self.configs[0]

    def _tuned(self, key: Key, tuning_key: tuple[Any, ...], args: tuple[Any, ...],
               kwargs: dict[str, Any], seconds: float) -> None:  # fmt: skip
        """Validates Triton's pick on fresh inputs and uploads it; a wrong pick is replaced by
        the first config (and stored nowhere)."""
        winner = self.cache[tuning_key]
        check = self._check(winner, args, kwargs, TOLERANCES.get(key.dtype, 1e-4), key)
        if not check.passed:
            self._warn_once("wrong", f"{key.short()}: the tuned config {winner} failed "
                                     f"validation ({check.note or check.rel_error}); using the "
                                     "first config")  # fmt: skip
            self.cache[tuning_key] = self.configs[0]
            return
        timings = getattr(self, "configs_timings", {}) or {}
        record = build_record(key, winner, timings, self.configs[0], validated(check), seconds)
        if record is None:
            self._warn_once("timing", f"{key.short()}: no usable timings; not uploaded")
            return
        if not settings().token:
            logger.info("%s: tuned here; not uploaded (no TUNECACHE_TOKEN)", key.short())
            return
        try:
            self._client().upload(record)
        except ServerError as exc:
            self._warn_once("upload", f"{key.short()}: not uploaded: {exc}")

    def _check(self, winner: Config, args: tuple[Any, ...], kwargs: dict[str, Any],
               tolerance: float, key: Key) -> Any:  # fmt: skip
        """The winner's outputs against ``reference`` (or the first config) on fresh inputs."""
        got = fresh_arguments(args, SEED)
        self.fn.run(*got, **kwargs, **winner.all_kwargs())
        want = fresh_arguments(args, SEED)
        if self.reference is not None:
            self.reference(*want)
        else:
            self.fn.run(*want, **kwargs, **self.configs[0].all_kwargs())
        return compare_outputs(got, want, tolerance, key.problem)

    def _rank(self) -> int:
        import torch.distributed as dist

        return int(dist.get_rank())

    def _warn_once(self, what: str, message: str) -> None:
        log = logger.debug if what in self._warned else logger.warning
        self._warned.add(what)
        log("tunecache.triton: %s", message)


def _distributed() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def _broadcast(config: dict[str, Any] | None) -> dict[str, Any]:
    """Rank 0's config, on every rank."""
    import torch.distributed as dist

    box = [config]
    dist.broadcast_object_list(box, src=0)
    chosen = box[0]
    assert isinstance(chosen, dict)
    return chosen


def autotune(
    configs: list[Config],
    key: list[str],
    *,
    url: str | None = None,
    snapshot: Path | str | None = None,
    on_miss: OnMiss = "tune",
    reference: Callable[..., Any] | None = None,
    policy: VersionPolicy = "strict",
    **options: Any,
) -> Callable[[Any], CachedAutotuner]:
    """A drop-in for ``triton.autotune`` whose winners come from and go to the shared cache.

    Args:
        configs, key: as ``triton.autotune``; ``options`` takes the rest of its arguments
            (``prune_configs_by``, ``reset_to_zero``, ``restore_value``, ``pre_hook``,
            ``post_hook``, ``warmup``, ``rep``, ``do_bench``, ``cache_results``).
        url: the cache server (default ``$TUNECACHE_URL``).
        snapshot: a snapshot file answered from before the server (default
            ``$TUNECACHE_SNAPSHOT``).
        on_miss: ``"tune"`` (benchmark the configs here, validate, upload with a write token)
            or ``"default"`` (launch the first config and report the miss).
        reference: ``reference(*args)`` computes the kernel's outputs in place (as the kernel
            does) to validate a tuned winner; without it the first config's output is the
            reference.
        policy: which tuned versions may be served (``strict``, ``compatible``, ``any``).

    Example:
        >>> @autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})],
        ...           key=["n"])  # doctest: +SKIP
        ... @triton.jit
        ... def scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr): ...
    """
    if on_miss not in ("tune", "default"):
        raise InvalidInput(f"on_miss={on_miss!r}: expected 'tune' or 'default'")
    found = settings()
    where = Path(snapshot) if snapshot is not None else found.snapshot

    def decorator(fn: Any) -> CachedAutotuner:
        return CachedAutotuner(fn, fn.arg_names, configs, key, url=url or found.url,
                               snapshot=where, policy=policy, on_miss=on_miss,
                               reference=reference, **options)  # fmt: skip

    return decorator


__all__ = ["CachedAutotuner", "autotune"]
