"""``tunecache.triton.autotune``: Triton's autotuner, fed from and feeding the shared cache.

:class:`CachedAutotuner` is a ``triton.runtime.autotuner.Autotuner`` that, before Triton would
benchmark a new tuning key, looks the call's :class:`~tunecache.Key` up (memo → snapshot file →
server). A served config is used only when it is one of the kernel's listed ``configs`` (then the
user's own ``triton.Config`` object is launched) or inside the space the user declared
(``space=``, with the listed configs' ``pre_hook``), the kernel's ``early_config_prune`` keeps it
for the call, it compiles for the device (no ``tl.static_assert`` failing, within its resources)
and its launch options fit the device; it goes into Triton's own per-key cache, so Triton launches
it with no benchmarking at all. Anything else is a miss (one warning per kernel).
With ``verify="first"`` a served config's first use in the process is checked against the
reference on copies of the call's arguments. A miss is tuned as Triton tunes (``on_miss="tune"``:
the listed configs benchmarked with Triton's ``do_bench``), the winner validated on fresh inputs
before Triton launches it into the call's tensors (a wrong one never is: the fastest config that
passes is, :mod:`tunecache.triton.fallback`) and uploaded, with the trials measured for its key,
when a write token is set; or the first config is launched and the miss reported
(``on_miss="default"``). With ``torch.distributed`` initialised, the first rank to reach a key
decides it and the others launch its choice (:mod:`tunecache.triton.ranks`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from triton import Config
from triton.runtime.autotuner import Autotuner

from tunecache.canonical import canonical_json
from tunecache.client import Client
from tunecache.defaults import TOLERANCES
from tunecache.errors import CheckUnavailable, InvalidInput, one_line
from tunecache.key import Key
from tunecache.policies import VersionPolicy
from tunecache.problem import describe
from tunecache.ranks import job_store
from tunecache.schemas import CheckModel
from tunecache.strict import printable_text
from tunecache.triton import fallback, hostbench, launching, ranks
from tunecache.triton.admission import Admission
from tunecache.triton.check import SEED
from tunecache.triton.checking import run_check
from tunecache.triton.hostbench import host_bench
from tunecache.triton.keys import KernelIdentity, KernelSpace, SpaceLike, key_of_call
from tunecache.triton.meanwhile import Meanwhile, capturing
from tunecache.triton.outage import forget_outcome, say_once, server_failed
from tunecache.triton.picks import Picks, TuningCall
from tunecache.triton.pruning import CallPrune, early_config_prune
from tunecache.triton.record import (
    DO_BENCH_TIMER,
    build_record,
    reference_label,
    validated,
)
from tunecache.triton.shared_client import server_url, settings, shared_client

logger = logging.getLogger(__name__)
_FROM = {"memo": "this process's memo", "snapshot": "the snapshot file", "server": "the server",
         "default": "the default"}  # fmt: skip
OnMiss = Literal["tune", "default"]
VerifyMode = Literal["never", "first"]


class CachedAutotuner(Admission, Autotuner):
    """A Triton autotuner whose per-key cache is filled from tunecache first."""

    def __init__(self, fn: Any, arg_names: list[str], configs: list[Config], key: list[str],
                 *, url: str | None, snapshot: Path | None, policy: VersionPolicy,
                 on_miss: OnMiss, reference: Callable[..., Any] | None,
                 space: SpaceLike | None = None, verify: VerifyMode = "never",
                 outputs: list[str] | None = None, **options: Any) -> None:  # fmt: skip
        reset_to_zero = options.pop("reset_to_zero", None)
        restore_value = options.pop("restore_value", None)
        self.prune_given = options.get("prune_configs_by")  # Triton's Autotuner keeps its parts
        interpreted = hostbench.interpreted()
        if interpreted:  # Triton's benchmarks need a GPU driver: the host clock stands in
            for gpu_only in ("warmup", "rep", "use_cuda_graph"):
                options.pop(gpu_only, None)
            options["do_bench"] = options.get("do_bench") or host_bench
        # What the records' timings say measured them: under the interpreter no GPU's time,
        # whichever do_bench ran (the built-in host clock or the user's own).
        self.timer = hostbench.TIMER if interpreted else DO_BENCH_TIMER
        super().__init__(fn, arg_names, configs, key, reset_to_zero, restore_value, **options)
        # The tuned meta-parameters and their types, as the listed configs give them.
        self.meta = {k: type(v) for c in self.configs for k, v in c.kwargs.items()}
        # The listed configs, indexed once: a served config is looked up, never rebuilt.
        self.space = KernelSpace(self.configs, space)
        self.url, self.snapshot, self.policy = url, snapshot, policy
        self.on_miss, self.reference, self.verify = on_miss, reference, verify
        unknown = [name for name in outputs or () if name not in arg_names]
        if unknown or (outputs is not None and (not outputs or len(set(outputs)) < len(outputs))):
            why = (
                f"{unknown} are not arguments of the kernel"
                if unknown
                else "names each output once, at least one (an empty list would compare nothing)"
            )
            raise InvalidInput(f"outputs={outputs!r}: {why}")
        self.outputs = None if outputs is None else list(outputs)  # None: every tensor argument
        # (key digest, config) that disagreed with the first config, no reference= given: not
        # used in this process, never disputed (:meth:`_verifier`)
        self._disagreed: set[tuple[str, str]] = set()
        self.benchmarked = 0  # tuning keys Triton benchmarked in this process
        self._warned: set[str] = set()
        # Triton's picks go through _checked_pick; what it needs is the calling thread's own
        # (two threads may tune two keys at once): TuningCall.
        self.cache: dict[Any, Config] = Picks(self._checked_pick)
        self._calls = threading.local()
        # Keys launched with the first config while the server did not answer: asked again
        # once it may be (:mod:`tunecache.triton.meanwhile`).
        self._meanwhile = Meanwhile()

    @functools.cached_property
    def identity(self) -> KernelIdentity:
        """The kernel's identity, on its first call: reading its source costs milliseconds, and a
        library routed whole (``tunecache.triton.install``) decorates hundreds of kernels."""
        return KernelIdentity.of(self.fn)

    # -- the run ---------------------------------------------------------------------------
    def run(self, *args: Any, **kwargs: Any) -> Any:
        arguments = {**dict(zip(self.arg_names, args, strict=False)), **kwargs}
        tuning_key = self._triton_key(arguments)
        if self._meanwhile and self._meanwhile.due(tuning_key, self._server_state):
            self._ask_again(arguments, tuning_key, args, kwargs)
        if len(self.configs) < 2 or tuning_key in self.cache:
            return super().run(*args, **kwargs)
        try:
            return self._new_key(arguments, tuning_key, args, kwargs)
        finally:  # what this thread held of the call (its tensors among it) is let go
            self._calls.now = self._calls.pruning = None

    def _new_key(self, arguments: dict[str, Any], tuning_key: tuple[Any, ...],
                 args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:  # fmt: skip
        """The first launch at ``tuning_key``: the config another rank decided for it, else
        served, tuned (and checked, and uploaded) or the first config, as Triton launches."""
        agreement = ranks.agree(self.identity, tuning_key)
        if agreement is not None and not agreement.decides:
            admit, fits = self._fits(args, kwargs, refuse=lambda what, config, why: why)
            chosen = agreement.follow(admit, fits, lambda: self._first(args, kwargs),
                                      self._warn_once)  # fmt: skip
            if chosen is not None:
                self.cache[tuning_key] = chosen
                launching.reset(self, self.cache[tuning_key], args, kwargs)
                return super().run(*args, **kwargs)
            agreement = None  # decided here alone
        try:
            return self._decide(arguments, tuning_key, args, kwargs)
        finally:  # nothing in the cache: the decider's call raised before a pick
            if agreement is not None:
                agreement.publish(self.cache.get(tuning_key))

    def _decide(self, arguments: dict[str, Any], tuning_key: tuple[Any, ...],
                args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:  # fmt: skip
        key = self._key(arguments)
        if key is not None:
            self._resolve(key, tuning_key, args, kwargs)
        tuned = tuning_key not in self.cache
        if tuned:
            # Triton sets the timings only when it benchmarks (not when pruning leaves one
            # config): whatever is there after the run was measured for this key.
            self.configs_timings: dict[Config, Any] = {}
            self._calls.now = None if key is None else TuningCall(key, tuning_key, args, kwargs)
        else:  # decided here, not by Triton's benchmark: Triton's reset all the same
            launching.reset(self, self.cache[tuning_key], args, kwargs)
        started = time.perf_counter()
        out = super().run(*args, **kwargs)
        call = self._call()
        if tuned:
            timings = dict(getattr(self, "configs_timings", None) or {})
            self.benchmarked += bool(timings)
            if call is not None:
                self._tuned(call, timings, time.perf_counter() - started)
        return out

    def _call(self) -> TuningCall | None:
        return getattr(self._calls, "now", None)

    def _bench(self, *args: Any, config: Config, **kwargs: Any) -> Any:
        if (call := self._call()) is not None:
            call.timed = True  # the pick Triton stores next comes from timings: it is checked
        try:
            measured = super()._bench(*args, config=config, **kwargs)
        except Exception as exc:  # the interpreter's failed ``tl.static_assert``: as a GPU's
            if not hostbench.cannot_run(exc):  # compile, "cannot run", timed as never faster
                raise
            self._warn_once(f"cannot run {config}", f"{self.identity.name}: {config} cannot run "
                            f"({one_line(exc)}): skipped, the others tuned")  # fmt: skip
            measured = [float("inf")] * 3
        if call is not None:
            call.times[config] = measured
        return measured

    def check_disk_cache(self, tuning_key: Any, configs: Any, bench_fn: Any) -> Any:
        if (call := self._call()) is not None:
            call.timed = True  # a pick from timings on disk (``cache_results``) is checked too
        return super().check_disk_cache(tuning_key, configs, bench_fn)

    def _pruning(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallPrune | None:
        """The kernel's ``early_config_prune`` for this call (``None``: it has none), made once
        per call: fitting served configs, the fallback and the reference share its one run."""
        held = getattr(self._calls, "pruning", None)
        if held is not None and held[0] is args:
            return held[1]
        prune = early_config_prune(self, self.prune_given)
        positional = dict(zip(self.arg_names, args, strict=False))  # Triton's ``nargs``
        pruning = None if prune is None else CallPrune(prune, self.configs, positional, kwargs)
        self._calls.pruning = (args, pruning)
        return pruning

    def _first(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Config:
        """The first config the kernel's ``early_config_prune`` keeps for this call."""
        pruning = self._pruning(args, kwargs)
        return self.configs[0] if pruning is None else pruning.first()

    def _checked_pick(self, tuning_key: Any, config: Config) -> Config:
        """What Triton's cache stores for ``tuning_key``: ``config``, unless it is Triton's pick
        from timings for the call this thread is tuning, which then runs on fresh copies of the
        call's arguments first; a wrong one is replaced (:meth:`_replacement`) before Triton
        launches the pick into the caller's tensors."""
        call = self._call()
        if call is None or call.tuning_key != tuning_key or not call.timed or call.picked:
            return config
        if fallback.could_not_run(call.times, config):  # none could: the launch says why
            return config
        check = self._validate(call.key, config, call.args, call.kwargs)
        call.picked = (config, check)
        if check is None or check.passed:
            return config
        return self._replacement(call, config, check, "this call and the later ones")

    def _replacement(self, call: TuningCall, failed: Config, check: CheckModel,
                     launch: str) -> Config:  # fmt: skip
        """What ``launch`` runs in place of ``failed`` (its ``check`` failed), warned once: the
        fastest config passing the same check (:mod:`tunecache.triton.fallback`), else one whose
        check could not run here; where every config ran and disagreed, the reference is the
        suspect (as where it cannot run) and Triton's pick is."""
        key, args, kwargs = call.key, call.args, call.kwargs
        tolerance = TOLERANCES.get(key.dtype, 1e-4)
        checks: dict[int, CheckModel | None] = {id(failed): check}  # None: its run raised

        def passes(config: Config) -> bool | None:
            try:
                got: CheckModel | None = self._check(config, args, kwargs, tolerance, key)
            except CheckUnavailable:  # not the config's fault: not known wrong
                return None
            except Exception:  # its own run raised: not taken
                got = None
            checks[id(config)] = got
            return got is not None and got.passed

        kept = self.configs if (pruning := self._pruning(args, kwargs)) is None else pruning.kept()
        found = fallback.fall_back(failed, call.times, kept, passes)
        then = fallback.shared(found, call.times, self.reference is not None)
        if then == fallback.SHARED and (won := checks.get(id(found.config))) is not None:
            call.replaced = (found.config, won, fallback.reasons(found, checks))  # see _tuned
        said = f"{key.short()}: the tuned config {failed} failed validation ({check.failure()})"
        self._warn_once("wrong", found.warning(said, launch, then))
        return found.launched

    def _validate(self, key: Key, config: Config, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> CheckModel | None:  # fmt: skip
        """``config``'s check on fresh inputs; ``None`` (warned) where it could not run here."""
        try:
            return self._check(config, args, kwargs, TOLERANCES.get(key.dtype, 1e-4), key)
        except CheckUnavailable as exc:  # never into the user's launch
            said = f"{config} ({one_line(exc)}): run unchecked, as Triton's own pick; not uploaded"
            self._warn_once("unchecked", f"{key.short()}: could not check the tuned config {said}")
            return None
        except Exception as exc:  # the config's own run failed on fresh inputs
            return CheckModel.raised(
                key.problem, SEED, printable_text(f"its run raised {one_line(exc)}", 512)
            )

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
    def _resolve(self, key: Key, tuning_key: tuple[Any, ...], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:  # fmt: skip
        """Fills Triton's cache for ``tuning_key`` from tunecache when a config inside the
        kernel's space fits (or with the first config on a miss when ``on_miss="default"``)."""
        admit, fits = self._fits(args, kwargs)
        # A config that does not fit is passed over: the next source, else a miss.
        verify = self._verifier(key, args, kwargs) if self.verify == "first" else None
        forget_outcome(self._client())  # what this lookup meets, not an earlier one
        result = self._client().lookup(key, default=None, fits=fits, verify=verify)
        if result.hit and result.config is not None:
            # Placed again (a memo answer is not re-fitted; the prune runs once): the user's own
            # listed object, or one built from the declared space.
            chosen = admit(result.config)
            if not isinstance(chosen, str):
                self.cache[tuning_key] = chosen
                logger.info("%s: launching %s from %s (%s rule), no benchmarking", key.short(),
                            chosen, _FROM[result.source], result.rule)  # fmt: skip
                return
        if server_failed(self._client()):  # not a miss: nothing tuned while the server is down
            # (its one warning is the server source's: "using default configs")
            logger.info("%s: the server did not answer (not a miss); launching the first "
                        "config, nothing tuned", key.short())  # fmt: skip
            self.cache[tuning_key] = self._first(args, kwargs)
            self._meanwhile.add(tuning_key, self._server_state()[1])  # asked again later
            return
        then = "launching the first config" if self.on_miss == "default" else "tuning it"
        logger.info("%s: no tuned config served (a miss); %s", key.short(), then)
        if self.on_miss == "default":
            self.cache[tuning_key] = self._first(args, kwargs)

    def _server_state(self) -> tuple[bool, float]:
        """Whether the server is marked down, and how long it is then skipped."""
        client = self._client()
        server = getattr(client, "server", None)
        return bool(getattr(server, "down", False)), float(getattr(client, "retry_after", 30.0))

    def _ask_again(self, arguments: dict[str, Any], tuning_key: tuple[Any, ...],
                   args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:  # fmt: skip
        """Asks for a key launched with the first config while the server did not answer: a
        served config that fits replaces it (one assignment: a thread launching the key
        meanwhile runs one or the other); a miss keeps it (nothing tuned, no reset mid-run);
        no answer, asked again later. What the ranks of a job agreed on stays; during a CUDA
        graph capture it is not asked (a check would synchronise the device)."""
        if capturing():
            return
        key = self._key(arguments)
        if key is None or job_store(lambda why: None) is not None:
            self._meanwhile.settle(tuning_key)
            return
        admit, fits = self._fits(args, kwargs)
        verify = self._verifier(key, args, kwargs) if self.verify == "first" else None
        forget_outcome(self._client())
        result = self._client().lookup(key, default=None, fits=fits, verify=verify)
        chosen = admit(result.config) if result.hit and result.config is not None else None
        if chosen is not None and not isinstance(chosen, str):
            self.cache[tuning_key] = chosen
            logger.info("%s: the server answers again; launching %s from %s (%s rule)",
                        key.short(), chosen, _FROM[result.source], result.rule)  # fmt: skip
        elif server_failed(self._client()):
            return  # still no answer: asked again later
        self._meanwhile.settle(tuning_key)

    def _verifier(self, key: Key, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Callable[[dict[str, Any]], CheckModel]:  # fmt: skip
        """``verify(config)``: a served config's outputs against the reference's, on identical
        seeded copies of this call's arguments (the caller's tensors are never written)."""
        tolerance = TOLERANCES.get(key.dtype, 1e-4)

        def verify(config: dict[str, Any]) -> CheckModel:
            chosen = self.space.find(config)
            if chosen is None:  # ``fits`` refuses it first (a memo answer is not re-fitted:
                # another decoration of the kernel, other configs): never launched, not disputed
                raise CheckUnavailable(f"{describe(config)} is outside this kernel's space")
            seen = (key.digest(), canonical_json(config))
            if seen not in self._disagreed:
                check = self._check(chosen, args, kwargs, tolerance, key)
                if check.passed or self.reference is not None:
                    return check  # a failure against the user's reference= is disputed
                self._disagreed.add(seen)
            # Against the first config, an unproven oracle (a scratch buffer laid out by BLOCK
            # differs between right configs): not used here, never disputed for everyone.
            raise CheckUnavailable("its outputs differ from the kernel's first config's, and "
                                   "with no reference= that proves neither wrong")  # fmt: skip

        return verify

    def _tuned(self, call: TuningCall, timings: dict[Config, Any], seconds: float) -> None:
        """Uploads Triton's pick, checked before its launch (:meth:`_checked_pick`), with
        ``timings`` (the ones measured for this key); a wrong pick is stored nowhere. A pick that
        reached the cache unchecked (a Triton whose ``_bench`` and ``check_disk_cache`` are named
        otherwise) is checked now, after its launch: a wrong one is replaced for the later calls."""
        key, tuning_key, args, kwargs, picked = (call.key, call.tuning_key, call.args,
                                                 call.kwargs, call.picked)  # fmt: skip
        winner = self.cache[tuning_key]
        if not timings:
            logger.info("%s: Triton launched %s without benchmarking (one config left after "
                        "pruning): nothing tuned, nothing uploaded", key.short(),
                        winner)  # fmt: skip
            return
        first = self._first(args, kwargs)
        if picked is None:  # checked after this call's launch (no ``_bench`` seen)
            check = self._validate(key, winner, args, kwargs)
            if check is not None and not check.passed:
                self.cache[tuning_key] = self._replacement(call, winner, check, "the later calls")
        else:
            winner, check = picked
        wrong: tuple[Config, ...] = ()
        if check is not None and not check.passed and call.replaced is not None:
            winner, check, wrong = call.replaced  # the fastest that passed, timed here
        if check is None or not check.passed:
            return
        against = reference_label(self.reference is not None, key.dtype, self.outputs)
        record = build_record(key, winner, timings, first, validated(check, against),
                              seconds, timer=self.timer, marks=wrong)  # fmt: skip
        if record is None:
            self._warn_once("timing", f"{key.short()}: no usable timings; not uploaded")
            return
        if server_url(self.url) is None:  # TUNECACHE_URL malformed: warned, no server
            return
        if not settings().token:  # said once a process: the team never gets what it tunes
            say_once("token", f"{key.short()}: tuned here, not uploaded: no TUNECACHE_TOKEN (a "
                              "write token shares what this process tunes; said once)")  # fmt: skip
            return
        # In the background: the first launch never waits for the server (nor a down one).
        self._client().upload_later(record)

    def _check(self, config: Config, args: tuple[Any, ...], kwargs: dict[str, Any],
               tolerance: float, key: Key) -> CheckModel:  # fmt: skip
        """``config``'s outputs against ``reference`` (or the first config) on identical fresh
        copies of the call's arguments, each launched as Triton launches first at a key
        (:func:`tunecache.triton.checking.run_check`). Raises :class:`CheckUnavailable` where
        the check itself cannot run or judge here."""
        first = self._first(args, kwargs) if self.reference is None else None
        return run_check(self, config, first, args, kwargs, tolerance, key)

    def _warn_once(self, what: str, message: str) -> None:
        log = logger.debug if what in self._warned else logger.warning
        self._warned.add(what)
        log("tunecache.triton: %s", message)


def autotune(
    configs: list[Config],
    key: list[str],
    *,
    url: str | None = None,
    snapshot: Path | str | None = None,
    on_miss: OnMiss = "tune",
    reference: Callable[..., Any] | None = None,
    policy: VersionPolicy = "strict",
    space: SpaceLike | None = None,
    verify: VerifyMode = "never",
    outputs: list[str] | None = None,
    **options: Any,
) -> Callable[[Any], CachedAutotuner]:
    """A drop-in for ``triton.autotune`` whose winners come from and go to the shared cache.

    Args:
        configs, key: as ``triton.autotune``; ``options`` takes the rest of its arguments
            (``prune_configs_by``, ``reset_to_zero``, ``restore_value``, ``pre_hook``,
            ``post_hook``, ``warmup``, ``rep``, ``do_bench``, ``cache_results``).
        url: the cache server (default ``$TUNECACHE_URL``; none where that is malformed).
        snapshot: a snapshot file asked before the server (default ``$TUNECACHE_SNAPSHOT``).
        on_miss: ``"tune"`` (benchmark the configs here, validate, upload with a write token)
            or ``"default"`` (launch the first config and report the miss).
        reference: ``reference(*args)`` computes the kernel's outputs in place, to check a
            tuned winner or (``verify="first"``) a served config; else the first config's.
        policy: which tuned versions may be served (``strict``, ``compatible``, ``any``).
        space: widens which served configs may launch (by default only one of ``configs``,
            and then the user's own ``triton.Config``): a mapping of parameter (meta-parameter
            or launch option) to its allowed values, or a :class:`tunecache.space.SearchSpace`;
            the parameters it leaves out keep one listed config's values together (``SPLIT``
            of one and ``ATOMIC`` of another is outside); ``4.0`` is not ``4``.
            Its configs run the listed configs' ``pre_hook`` (see
            :class:`~tunecache.triton.keys.PreHooks` for when none can be told).
        verify: ``"never"`` or ``"first"``: a served config's first launch in this process
            (once per key) runs on seeded copies of the arguments, compared with the reference
            at the dtype's tolerance; a mismatch falls back as a miss and disputes the record
            only against ``reference``. Two extra launches per key and process.
        outputs: the names of the arguments a check compares (default: every tensor
            argument); leave out a scratch buffer whose contents depend on the config.

    Example:
        >>> @autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})],
        ...           key=["n"])  # doctest: +SKIP
        ... @triton.jit
        ... def scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr): ...
    """
    if on_miss not in ("tune", "default"):
        raise InvalidInput(f"on_miss={on_miss!r}: expected 'tune' or 'default'")
    if verify not in ("never", "first"):
        raise InvalidInput(f"verify={verify!r}: expected 'never' or 'first'")
    where = Path(snapshot) if snapshot is not None else settings().snapshot

    def decorator(fn: Any) -> CachedAutotuner:
        return CachedAutotuner(fn, fn.arg_names, configs, key, url=url,
                               snapshot=where, policy=policy, on_miss=on_miss,
                               reference=reference, space=space, verify=verify,
                               outputs=outputs, **options)  # fmt: skip

    return decorator


__all__ = ["CachedAutotuner", "autotune"]
