"""The cache key of a user's Triton kernel call, and whether a fetched config may launch.

The key is built from what Triton's own autotuner keys on, made portable: the kernel's qualified
name and a hash of its source, the ``key=`` arguments as the problem (with every tensor argument's
dtype as a flag), the first tensor's dtype, the device the kernel launches on (the GPU; the CPU
under ``TRITON_INTERPRET=1``) and the Triton and torch versions.

A served config launches only when it is data of the right shape (:func:`misfit`: the closed
schema, the kernel's tuned meta-parameters, launch options the device can run) and inside the
kernel's space (:class:`KernelSpace`: one of its listed ``configs``, as Triton's own contract has
it, or inside a space the user declared).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from triton import Config

from tunecache.configcheck.triton import LAUNCH_OPTIONS, config_problem, launch_problem
from tunecache.device import Device, local_device
from tunecache.environment import environment_for
from tunecache.errors import InvalidInput
from tunecache.key import DTYPES, Key
from tunecache.problem import describe
from tunecache.space import Config as SpaceConfig
from tunecache.space import SearchSpace, kinded

_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")
_SM = re.compile(r"sm_(\d+)[a-z]?")
_DEFAULT = Config({})
# A launch option a config leaves out takes Triton's default (this Triton's ``Config``).
LAUNCH_DEFAULTS: Final[dict[str, Any]] = {
    "num_warps": _DEFAULT.num_warps,
    "num_stages": _DEFAULT.num_stages,
    "num_ctas": getattr(_DEFAULT, "num_ctas", 1),
    "maxnreg": getattr(_DEFAULT, "maxnreg", None),
}
REGISTERS_PER_BLOCK: Final = 65536  # every NVIDIA GPU since Kepler
CLUSTERS_SINCE: Final = 90  # thread-block clusters (num_ctas > 1): sm_90 and newer
SpaceLike = Mapping[str, Iterable[Any]] | SearchSpace


def base_function(fn: Any) -> Any:
    """The Python function under a Triton ``JITFunction`` (or the interpreter's wrapper)."""
    while hasattr(fn, "fn"):
        fn = fn.fn
    return fn


def module_name(fn: Any) -> str:
    """``fn``'s module as an import names it, so that one kernel has one key however its file is
    run: a script run as ``python rowmax.py`` (``__main__``) is ``rowmax``, as ``import rowmax``
    names it beside the file, and ``python -m pkg.rowmax`` is ``pkg.rowmax``."""
    module = str(fn.__module__)
    if module != "__main__":
        return module
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and getattr(spec, "name", None):
        return str(spec.name)
    path = getattr(main, "__file__", None)
    return Path(path).stem if isinstance(path, str) and path.endswith(".py") else module


@dataclass(frozen=True)
class KernelIdentity:
    """What identifies a decorated kernel: name, source hash, argument and meta-parameter names."""

    name: str
    source_hash: str
    arg_names: tuple[str, ...]
    meta_params: frozenset[str]  # the ``tl.constexpr`` parameters

    @classmethod
    def of(cls, jit_fn: Any) -> KernelIdentity:
        fn = base_function(jit_fn)
        name = _UNSAFE.sub("_", f"{module_name(fn)}:{fn.__qualname__}")[:128]
        try:
            source = inspect.getsource(fn)
        except (OSError, TypeError):  # no source file (a REPL): the bytecode stands in
            source = fn.__code__.co_code.hex()
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        parameters = inspect.signature(fn).parameters
        meta = frozenset(p for p, v in parameters.items() if "constexpr" in str(v.annotation))
        return cls(name, digest, tuple(parameters), meta)


def _dtype_name(arg: Any) -> str:
    return str(arg.dtype).removeprefix("torch.")


def call_device(tensors: Sequence[Any]) -> Device:
    """The device a call launches on: the first CUDA tensor's GPU, else this CPU."""
    for tensor in tensors:
        if getattr(getattr(tensor, "device", None), "type", None) == "cuda":
            import torch

            props = torch.cuda.get_device_properties(tensor.device.index or 0)
            return Device.from_cuda_properties(props)
    return local_device("cpu")


def key_of_call(
    identity: KernelIdentity, key_names: Sequence[str], arguments: Mapping[str, Any]
) -> Key:
    """The key of one call, from its named ``arguments``.

    Raises:
        InvalidInput: a ``key=`` argument is not a size, flag or short string, or no tensor
            argument has a dtype the key can name.
    """
    tensors = [v for v in arguments.values() if hasattr(v, "dtype") and hasattr(v, "data_ptr")]
    dtypes = [_dtype_name(t) for t in tensors]
    dtype = next((d for d in dtypes if d in DTYPES), None)
    if dtype is None:
        raise InvalidInput(f"{identity.name}: no tensor argument of a dtype in {DTYPES}")
    problem: dict[str, Any] = {name: arguments[name] for name in key_names if name in arguments}
    for name, value in arguments.items():
        if hasattr(value, "dtype") and hasattr(value, "data_ptr"):
            problem[f"{name}.dtype"] = _dtype_name(value)
    return Key(
        kernel=identity.name,
        source_hash=identity.source_hash,
        backend="triton",
        problem=problem,
        dtype=dtype,
        device=call_device(tensors).fingerprint,
        environment=environment_for("triton"),
    )


def misfit(config: Mapping[str, Any], identity: KernelIdentity, meta: Mapping[str, type],
           device: Device) -> str | None:  # fmt: skip
    """Why ``config`` must not be launched for this kernel on ``device``, or ``None``.

    A config fits when it passes the closed schema of a Triton config
    (:func:`tunecache.configcheck.triton.config_problem`: numeric meta-parameters, launch options
    strict integers in range), its meta-parameters are exactly the tuned ones (``meta``: name →
    the type its listed configs give it; all ``tl.constexpr`` parameters of the kernel), each of
    that type, and its launch options fit ``device`` (:func:`launch_misfit`). Whether it is inside
    the kernel's space is :class:`KernelSpace`'s question.
    """
    if (why := config_problem(config)) is not None:
        return why
    names = set(config) - set(LAUNCH_OPTIONS)
    if names != set(meta):
        return f"meta-parameters {sorted(names)} are not the kernel's tuned {sorted(meta)}"
    if runtime := sorted(names - identity.meta_params):  # a listed config sets them too
        return (
            f"{runtime} {'is' if len(runtime) == 1 else 'are'} not tl.constexpr in the "
            "kernel (a runtime argument its configs set): served configs are not placed"
        )
    for name in sorted(names):
        if type(config[name]) is not meta[name]:  # a bool is no int, a string no block size
            return f"{name}={describe(config[name])} is not a {meta[name].__name__}"
    return launch_misfit(config, device)


def _sm(device: Device) -> int | None:
    """The compute capability of a CUDA device (``sm_90`` → 90), else ``None``."""
    found = _SM.fullmatch(device.fingerprint.arch)
    return int(found.group(1)) if device.kind == "cuda" and found else None


def launch_misfit(config: Mapping[str, Any], device: Device) -> str | None:
    """Why ``config``'s launch options cannot run on ``device``, or ``None``.

    Types and ranges hold everywhere (:func:`~tunecache.configcheck.triton.launch_problem`);
    ``num_ctas`` above 1 needs thread-block clusters (a CUDA GPU of sm_90 or newer); on a device
    with limits (a GPU), ``num_warps`` × the warp size stays within its threads per block and
    ``maxnreg`` × those threads within :data:`REGISTERS_PER_BLOCK`. The CPU under Triton's
    interpreter has no limits beyond types and ranges.
    """
    if (why := launch_problem(config)) is not None:
        return why
    ctas = config.get("num_ctas", LAUNCH_DEFAULTS["num_ctas"])
    if ctas != 1 and ((sm := _sm(device)) is None or sm < CLUSTERS_SINCE):
        return f"num_ctas={ctas} needs thread-block clusters (sm_{CLUSTERS_SINCE} or newer); " \
               f"{device.fingerprint.arch} has none"  # fmt: skip
    limits = device.limits
    if limits is None:
        return None
    warps = config.get("num_warps", LAUNCH_DEFAULTS["num_warps"])
    threads = warps * limits.warp_size
    if threads > limits.max_threads_per_block:
        return f"num_warps={warps} is {threads} threads; the device allows " \
               f"{limits.max_threads_per_block}"  # fmt: skip
    registers = config.get("maxnreg")
    if registers is not None and registers * threads > REGISTERS_PER_BLOCK:
        return f"maxnreg={registers} x {threads} threads is {registers * threads} registers; " \
               f"a block has {REGISTERS_PER_BLOCK}"  # fmt: skip
    return None


# -- the kernel's space ------------------------------------------------------------------------
def flat(config: Mapping[str, Any]) -> dict[str, Any]:
    """A flat config (meta-parameters and launch options) with every launch option present,
    Triton's default where it was left out."""
    return {**LAUNCH_DEFAULTS, **config}


def flat_of(config: Config) -> dict[str, Any]:
    """A ``triton.Config`` as a :func:`flat` config."""
    launch = {option: getattr(config, option, LAUNCH_DEFAULTS[option]) for option in LAUNCH_OPTIONS}
    return {**config.kwargs, **launch}


def identity_of(config: Mapping[str, Any]) -> str:
    """What makes two flat configs the same: canonical JSON, types included (``4.0`` is not
    ``4``, ``true`` is not ``1``)."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"), default=repr)


def triton_config(config: Mapping[str, Any], pre_hook: Any = None) -> Config:
    """A ``triton.Config`` from a flat config (launch options Triton's defaults where absent)."""
    launch = {k: config[k] for k in LAUNCH_OPTIONS if k in config}
    meta = {k: v for k, v in config.items() if k not in launch}
    return Config(meta, pre_hook=pre_hook, **launch)


class DeclaredSpace:
    """A space the user declares (``space=``): each parameter's allowed values.

    The parameters the space does not name keep, together, the values of one listed config (a
    launch option none of them sets: Triton's default): a kernel listing ``SPLIT=1, ATOMIC=False``
    and ``SPLIT=4, ATOMIC=True`` is wrong at ``SPLIT=4, ATOMIC=False``, which takes each value from
    a listed config but is none of them. Values compare with their types: ``4.0`` is not ``4``. A
    :class:`~tunecache.space.SearchSpace` also applies its constraint and members.

    Raises:
        InvalidInput: the space names a parameter that is neither a meta-parameter of the listed
            configs nor a launch option, or gives a value that is not a scalar.
    """

    def __init__(self, space: SpaceLike, listed: Sequence[Mapping[str, Any]]) -> None:
        params: Mapping[str, Iterable[Any]] = space.params if isinstance(space, SearchSpace) \
            else space  # fmt: skip
        if not isinstance(params, Mapping) or not params:
            raise InvalidInput("space= must map each parameter to its allowed values")
        names = {name for config in listed for name in config}
        unknown = sorted(set(params) - names)
        if unknown:
            raise InvalidInput(f"space= names {unknown}: neither a meta-parameter of the listed "
                               f"configs nor a launch option {LAUNCH_OPTIONS}")  # fmt: skip
        self.search = space if isinstance(space, SearchSpace) else None
        self.named = frozenset(params)
        # The rest are held together, not one by one: their values may only work as the
        # listed configs pair them (SPLIT=4 with ATOMIC=True), so one listed config's or none.
        self.rest = sorted(names - self.named)
        self.rests: dict[str, dict[str, Any]] = {}
        for rest in (self.rest_of(config) for config in listed):
            self.rests.setdefault(identity_of(rest), rest)
        self.allowed: dict[str, frozenset[tuple[str, Any]]] = {}
        for name in sorted(names):
            values = params[name] if name in params else [c.get(name) for c in listed]
            try:
                self.allowed[name] = frozenset(kinded(v) for v in values)
            except TypeError as exc:
                raise InvalidInput(f"space= {name}: values must be scalars ({exc})") from exc

    def rest_of(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config``'s values of the parameters the space does not name."""
        return {name: config.get(name) for name in self.rest}

    def problem(self, config: Mapping[str, Any]) -> str | None:
        """Why the :func:`flat` ``config`` is outside this space, or ``None``."""
        if set(config) != set(self.allowed):
            return f"its parameters {sorted(config)} are not the space's {sorted(self.allowed)}"
        for name, value in config.items():
            try:
                inside = kinded(value) in self.allowed[name]
            except TypeError:
                inside = False
            if not inside:
                return f"{name}={describe(value, 20)} is outside the declared space"
        if identity_of(self.rest_of(config)) not in self.rests:
            return self._unlisted(config)
        if self.search is None:
            return None
        try:  # a config the space cannot name, or a constraint that answers no reason: outside
            named = SpaceConfig.of({k: v for k, v in config.items() if k in self.search.params})
            return self.search.prune_reason(named)
        except InvalidInput as exc:
            return str(exc)

    def _unlisted(self, config: Mapping[str, Any]) -> str:
        """Why ``config``, each of whose values a listed config has, is still outside: the
        parameters the space does not name (those the listed configs vary) mix listed configs."""
        held = list(self.rests.values())
        varying = [n for n in self.rest if len({identity_of(r[n]) for r in held}) > 1] \
            or self.rest  # fmt: skip
        theirs = [{n: rest[n] for n in varying} for rest in held]
        mixed = describe({n: config.get(n) for n in varying}, 200)
        return (
            f"its {mixed} are no listed config's together: the parameters the space does not "
            f"name keep one listed config's values, and the listed configs hold "
            f"{describe(theirs, 200)}"
        )


class PreHooks:
    """Which listed ``pre_hook`` a config from a declared space runs (a hook may zero an output
    the kernel then adds into: dropping it changes the result).

    The one all listed configs share (the same function, or all ``None``); else the one shared by
    the listed configs that have the config's values of every parameter the declared space does
    not name. Where those differ, or no listed config has those values, it cannot be told.
    """

    def __init__(self, configs: Sequence[Config], flats: Sequence[Mapping[str, Any]],
                 declared: DeclaredSpace) -> None:  # fmt: skip
        hooks = [getattr(config, "pre_hook", None) for config in configs]
        self.common = _distinct(hooks)
        self._rest = declared.rest_of  # the listed configs' rests are the declared space's
        self.by_rest: dict[str, list[Any]] = {}
        for hook, flattened in zip(hooks, flats, strict=True):
            self.by_rest.setdefault(identity_of(self._rest(flattened)), []).append(hook)

    def choose(self, config: Mapping[str, Any]) -> tuple[Any, str | None]:
        """The ``pre_hook`` for the :func:`flat` ``config``, and ``None``; or ``None`` and why
        it cannot be told."""
        if len(self.common) == 1:
            return self.common[0], None
        rest = self._rest(config)
        hooks = _distinct(self.by_rest.get(identity_of(rest), []))
        if len(hooks) == 1:
            return hooks[0], None
        why = "which pre_hook it needs cannot be told: the listed configs"
        if not hooks:
            return None, f"{why}' pre_hooks differ and none of them has its " \
                         f"{describe(rest, 200)}"  # fmt: skip
        where = f" with its {describe(rest, 200)}" if rest else ""
        return None, f"{why}{where} have different pre_hooks"


def _distinct(hooks: Iterable[Any]) -> list[Any]:
    """``hooks`` without repeats (the same function, or an equal bound method)."""
    found: list[Any] = []
    for hook in hooks:
        if not any(hook is seen or hook == seen for seen in found):
            found.append(hook)
    return found


class KernelSpace:
    """The configs a kernel launches: its listed ``configs`` (Triton's contract: the list is the
    space), widened by a declared space when the user gives one.

    The listed configs are indexed once; a served config is looked up by its canonical JSON, so
    the check costs one serialisation, at lookup time only.
    """

    def __init__(self, configs: Sequence[Config], declared: SpaceLike | None = None) -> None:
        self.listed: dict[str, Config] = {}
        flats = [flat_of(c) for c in configs]
        for config, flattened in zip(configs, flats, strict=True):
            self.listed.setdefault(identity_of(flattened), config)
        self.declared = DeclaredSpace(declared, flats) if declared is not None else None
        self.hooks = PreHooks(configs, flats, self.declared) if self.declared else None

    def find(self, config: Mapping[str, Any]) -> Config | None:
        """The ``triton.Config`` to launch for a served ``config``: the user's own listed object
        when it is one of them (its ``pre_hook`` and all), one built from the values when it is
        inside the declared space (with the listed configs' ``pre_hook``, :class:`PreHooks`);
        ``None`` when it is outside the kernel's space."""
        placed = self.place(config)
        return placed if isinstance(placed, Config) else None

    def place(self, config: Mapping[str, Any]) -> Config | str:
        """What :meth:`find` launches for ``config``, or why it is outside the space."""
        full = flat(config)
        listed = self.listed.get(identity_of(full))
        if listed is not None:
            return listed
        where = "not one of the kernel's listed configs"
        if self.declared is None or self.hooks is None:
            return f"{where} (pass space= to accept more)"
        if (why := self.declared.problem(full)) is not None:
            return f"{where}, and {why}"
        # A config's ir_override is IR dumped for its own values: a built config compiles.
        hook, why = self.hooks.choose(full)
        return f"{where}, and {why}" if why is not None else triton_config(full, hook)

    def outside(self, config: Mapping[str, Any]) -> str:
        """Why a config :meth:`find` refused is outside the space."""
        placed = self.place(config)
        return placed if isinstance(placed, str) else "inside the kernel's space"
