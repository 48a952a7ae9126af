"""Whether a fetched config's kernel fits a GPU's shared memory, found by compiling it.

Triton compiles for a GPU target with no GPU present, and the compiled kernel says how much shared
memory it needs (``metadata.shared``). A config tuned on a GPU with more shared memory (an H100's
227 KiB) may not fit a smaller one (an A100's 163 KiB, a consumer card's 99 KiB): it is refused
before launch, and the next source or the default config is used. Triton caches the compile on
disk, so the launch that follows pays nothing more.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tunecache.device import Device
from tunecache.triton.keys import LAUNCH_OPTIONS, base_function

logger = logging.getLogger(__name__)
_TYPES = {
    "float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64",
    "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5", "int8": "i8", "int16": "i16",
    "int32": "i32", "int64": "i64", "uint8": "u8", "bool": "i1",
}  # fmt: skip


def _signature(arguments: Mapping[str, Any], constexprs: Mapping[str, Any]) -> dict[str, str]:
    signature = {}
    for name, value in arguments.items():
        if name in constexprs:
            signature[name] = "constexpr"
        elif hasattr(value, "data_ptr") and hasattr(value, "dtype"):
            signature[name] = "*" + _TYPES[str(value.dtype).removeprefix("torch.")]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name] = "constexpr"
    return signature


def shared_memory(jit_fn: Any, arguments: Mapping[str, Any], config: Mapping[str, Any],
                  arch: str) -> int:  # fmt: skip
    """Bytes of shared memory ``jit_fn`` needs with ``config`` on ``arch`` (``sm_90``).

    Raises:
        Exception: whatever Triton raises when the kernel does not compile for the target.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    meta = {k: v for k, v in config.items() if k not in LAUNCH_OPTIONS}
    constexprs = {**{k: v for k, v in arguments.items() if k in meta}, **meta}
    fn = JITFunction(base_function(jit_fn))
    named = {**{p: None for p in fn.arg_names}, **arguments, **meta}
    source = ASTSource(fn, _signature(named, constexprs), constexprs)
    options = {k: config[k] for k in ("num_warps", "num_stages", "num_ctas") if k in config}
    capability = int(arch.removeprefix("sm_"))
    kernel = triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)
    return int(kernel.metadata.shared)


def shared_misfit(jit_fn: Any, arguments: Mapping[str, Any], config: Mapping[str, Any],
                  device: Device) -> str | None:  # fmt: skip
    """Why ``config`` does not fit ``device``'s shared memory, or ``None`` (also when it cannot
    be told: a CPU, or a kernel Triton cannot compile here, which the launch will report)."""
    if device.limits is None or not device.fingerprint.arch.startswith("sm_"):
        return None
    from triton.runtime.errors import OutOfResources

    try:
        needed = shared_memory(jit_fn, arguments, config, device.fingerprint.arch)
    except OutOfResources as exc:  # by its type: a message can say anything (a docstring too)
        return f"does not compile within the device's resources: {str(exc)[:200]}"
    except Exception as exc:  # not compilable here: the launch will say why; decide nothing
        logger.debug("could not size the shared memory of %s: %s", config, exc)
        return None
    allowed = device.limits.max_shared_memory_per_block
    if needed > allowed:
        return f"needs {needed} bytes of shared memory; {device.fingerprint.name} allows {allowed}"
    return None
