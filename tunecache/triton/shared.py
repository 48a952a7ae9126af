"""Whether a fetched config's kernel compiles for this call and fits a GPU's shared memory,
found by compiling it.

Triton compiles for a GPU target with no GPU present, and the compiled kernel says how much shared
memory it needs (``metadata.shared``). A config tuned on a GPU with more shared memory (an H100's
227 KiB) may not fit a smaller one (an A100's 163 KiB, a consumer card's 99 KiB): it is refused
before launch, and the next source or the default config is used. So is a config whose compile
fails the way Triton's own autotuner counts as "cannot run" (its benchmark times it as infinitely
slow, so it is never picked): a ``tl.static_assert`` failing for this call's ``tl.constexpr``
arguments, resources beyond the device's, ``ptxas`` refusing it. Other compile errors decide
nothing (the launch will say why). Triton caches the compile on disk, so the launch that follows
pays nothing more.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from collections.abc import Collection, Mapping
from typing import Any

from tunecache.device import Device
from tunecache.triton.keys import LAUNCH_OPTIONS, base_function

logger = logging.getLogger(__name__)
_TYPES = {
    "float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64",
    "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5", "int8": "i8", "int16": "i16",
    "int32": "i32", "int64": "i64", "uint8": "u8", "bool": "i1",
}  # fmt: skip


# What Triton's autotuner counts as a config that cannot run (``Autotuner._bench``), by type.
_CANNOT_RUN = {
    "OutOfResources": ("triton.runtime.errors", "does not compile within the device's resources"),
    "CompileTimeAssertionFailure": ("triton.compiler.errors",
                                    "fails the kernel's tl.static_assert at this call"),
    "PTXASError": ("triton.runtime.errors", "is refused by ptxas (its compile)"),
}  # fmt: skip


@functools.cache
def _cannot_run() -> dict[type[BaseException], str]:
    """The error types of :data:`_CANNOT_RUN` this Triton has (a name it lacks is left out)."""
    found: dict[type[BaseException], str] = {}
    for name, (module, meaning) in _CANNOT_RUN.items():
        try:
            error = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        if isinstance(error, type) and issubclass(error, BaseException):
            found[error] = meaning
    return found


def _signature(arguments: Mapping[str, Any], constexprs: Collection[str]) -> dict[str, str]:
    signature = {}
    for name, value in arguments.items():
        if name in constexprs or value is None:
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
    base = base_function(jit_fn)
    fn = JITFunction(base)
    # The kernel's ``tl.constexpr`` parameters are compiled with this call's values (its
    # defaults where the call leaves one out), as the launch compiles them.
    parameters = inspect.signature(base).parameters
    declared = {p for p, v in parameters.items() if "constexpr" in str(v.annotation)}
    defaults = {p: v.default for p, v in parameters.items() if v.default is not v.empty}
    named = {**{p: None for p in fn.arg_names}, **defaults, **arguments, **meta}
    signature = _signature(named, {*declared, *meta})
    constexprs = {k: named[k] for k, kind in signature.items() if kind == "constexpr"}
    source = ASTSource(fn, signature, constexprs)
    options = {k: config[k] for k in ("num_warps", "num_stages", "num_ctas") if k in config}
    capability = int(arch.removeprefix("sm_"))
    kernel = triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)
    return int(kernel.metadata.shared)


def shared_misfit(jit_fn: Any, arguments: Mapping[str, Any], config: Mapping[str, Any],
                  device: Device) -> str | None:  # fmt: skip
    """Why ``config`` cannot run at this call on ``device``, or ``None``: its compile for the
    device fails as Triton's autotuner counts a config that cannot run (a ``tl.static_assert``,
    resources, ``ptxas``), or it needs more shared memory than the device has. ``None`` also when
    it cannot be told: a CPU, or a kernel Triton cannot compile here (the launch will report)."""
    if device.limits is None or not device.fingerprint.arch.startswith("sm_"):
        return None
    cannot_run = _cannot_run()
    try:
        needed = shared_memory(jit_fn, arguments, config, device.fingerprint.arch)
    except tuple(cannot_run) as exc:  # by its type: a message can say anything (a docstring too)
        meaning = next(text for error, text in cannot_run.items() if isinstance(exc, error))
        return f"{meaning}: {_detail(exc)}"
    except Exception as exc:  # not compilable here: the launch will say why; decide nothing
        logger.debug("could not size the shared memory of %s: %s", config, exc)
        return None
    allowed = device.limits.max_shared_memory_per_block
    if needed > allowed:
        return f"needs {needed} bytes of shared memory; {device.fingerprint.name} allows {allowed}"
    return None


def _detail(exc: BaseException) -> str:
    """What a compile error says, in one short line: a ``CompilationError``'s failing source line
    and its message, without the source excerpt its text starts with."""
    src, line = getattr(exc, "src", None), getattr(getattr(exc, "node", None), "lineno", None)
    lines = src.splitlines() if isinstance(src, str) else []
    parts = [lines[line - 1]] if isinstance(line, int) and 0 < line <= len(lines) else []
    message = getattr(exc, "error_message", None)
    if message:
        parts.append(str(message))
    return " ".join(" | ".join(parts or [str(exc)]).split())[:200]
