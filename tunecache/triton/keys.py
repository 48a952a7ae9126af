"""The cache key of a user's Triton kernel call, and whether a fetched config fits it.

The key is built from what Triton's own autotuner keys on, made portable: the kernel's qualified
name and a hash of its source, the ``key=`` arguments as the problem (with every tensor argument's
dtype as a flag), the first tensor's dtype, the device the kernel launches on (the GPU; the CPU
under ``TRITON_INTERPRET=1``) and the Triton and torch versions.
"""

from __future__ import annotations

import hashlib
import inspect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tunecache.device import Device, local_device
from tunecache.environment import environment_for
from tunecache.key import DTYPES, Key

# Launch options a Triton config may carry beside its meta-parameters, with their legal values.
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
_WARPS = (1, 2, 4, 8, 16, 32)
_MAX_STAGES = 8
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


def base_function(fn: Any) -> Any:
    """The Python function under a Triton ``JITFunction`` (or the interpreter's wrapper)."""
    while hasattr(fn, "fn"):
        fn = fn.fn
    return fn


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
        name = _UNSAFE.sub("_", f"{fn.__module__}:{fn.__qualname__}")[:128]
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
    from tunecache.errors import InvalidInput

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

    A config fits when its meta-parameters are exactly the tuned ones (``meta``: name → the type
    its listed configs give it; all ``tl.constexpr`` parameters of the kernel), each of that type,
    and its launch options are legal here: warps a power of two within the device's threads per
    block, 1 to 8 stages.
    """
    if not isinstance(config, Mapping):
        return f"a config must be an object, not {type(config).__name__}"
    names = set(config) - set(LAUNCH_OPTIONS)
    if names != set(meta) or not names <= identity.meta_params:
        return f"meta-parameters {sorted(names)} are not the kernel's tuned {sorted(meta)}"
    for name in sorted(names):
        if type(config[name]) is not meta[name]:  # a bool is no int, a string no block size
            return f"{name}={str(config[name])[:40]!r} is not a {meta[name].__name__}"
    return _launch_misfit(config, device)


def _launch_misfit(config: Mapping[str, Any], device: Device) -> str | None:
    warps = config.get("num_warps", 4)
    if isinstance(warps, bool) or warps not in _WARPS:
        return f"num_warps={str(warps)[:20]} is not one of {_WARPS}"
    if device.limits is not None:
        threads = warps * device.limits.warp_size
        if threads > device.limits.max_threads_per_block:
            return f"num_warps={warps} is {threads} threads; the device allows " \
                   f"{device.limits.max_threads_per_block}"  # fmt: skip
    stages = config.get("num_stages", 3)
    if isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= _MAX_STAGES:
        return f"num_stages={str(stages)[:20]} is not in 1..{_MAX_STAGES}"
    for option in ("num_ctas", "maxnreg"):
        value = config.get(option)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= 65536):  # fmt: skip
            return f"{option}={str(value)[:20]} is not a positive integer"
    return None
