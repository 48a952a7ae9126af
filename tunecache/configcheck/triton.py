"""The closed schema of a Triton config: flat, numeric meta-parameters and legal launch options.

A Triton config on the wire is one flat object: the kernel's ``tl.constexpr`` meta-parameters
(``BLOCK_M``, ``GROUP_SIZE_M`` …) and Triton's launch options (``num_warps``, ``num_stages``,
``num_ctas``, ``maxnreg``). What a served config may hold, whatever kernel it is for:

- meta-parameters: a name like a Python identifier, a value that is an integer (within int32), a
  finite float or a boolean: never a string, a list or an object;
- ``num_warps`` a power of two from 1 to 32, ``num_stages`` 0 to 8, ``num_ctas`` a power of two
  from 1 to 16, ``maxnreg`` 1 to 255 (registers per thread): strict integers (``4.0`` is not 4).

What fits one kernel (its listed configs, its enumerated space) and one device (threads, registers,
clusters) is checked where the kernel and the device are known (:mod:`tunecache.triton.keys`,
:mod:`tunecache.configcheck` for the built-in kernels' spaces).

Example:
    >>> config_problem({"BLOCK": 128, "num_warps": 4})
    >>> config_problem({"BLOCK": 128, "num_warps": 4.0})
    'num_warps=4.0 is not an integer'
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final

from tunecache.problem import describe

LAUNCH_OPTIONS: Final = ("num_warps", "num_stages", "num_ctas", "maxnreg")
WARPS: Final = (1, 2, 4, 8, 16, 32)
CTAS: Final = (1, 2, 4, 8, 16)
MAX_STAGES: Final = 8
MAX_REGISTERS_PER_THREAD: Final = 255  # every NVIDIA GPU since Kepler
MAX_PARAMS: Final = 64
META_INT_MAX: Final = 2**31 - 1  # a meta-parameter is specialised as an i32 constexpr
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_RANGES: Final[dict[str, tuple[int, ...] | range]] = {
    "num_warps": WARPS,
    "num_stages": range(0, MAX_STAGES + 1),
    "num_ctas": CTAS,
    "maxnreg": range(1, MAX_REGISTERS_PER_THREAD + 1),
}


def strict_int(value: Any) -> bool:
    """An ``int`` that is not a ``bool`` (JSON's ``true`` is no count, ``4.0`` no warp count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def launch_problem(config: Mapping[str, Any]) -> str | None:
    """Why ``config``'s launch options are not legal anywhere, or ``None``."""
    for option, allowed in _RANGES.items():
        if option not in config:
            continue
        value = config[option]
        if not strict_int(value):
            return f"{option}={describe(value, 20)} is not an integer"
        if value not in allowed:
            span = allowed if isinstance(allowed, tuple) else f"{allowed[0]}..{allowed[-1]}"
            return f"{option}={value} is not in {span}"
    return None


def meta_problem(name: Any, value: Any) -> str | None:
    """Why ``name=value`` is not a meta-parameter a served config may carry, or ``None``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return f"{describe(name)} is not a meta-parameter name"
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if abs(value) > META_INT_MAX:
            return f"{name}={describe(value, 20)} is outside int32"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{name}={value!r} is not finite"
    return f"{name}={describe(value, 40)} is not a number or a boolean"


def config_problem(config: Any) -> str | None:
    """Why ``config`` is not a Triton config a client may launch, or ``None``."""
    if not isinstance(config, Mapping):
        return f"a Triton config is an object, not {type(config).__name__}"
    if not 0 < len(config) <= MAX_PARAMS:
        return f"a Triton config has 1 to {MAX_PARAMS} entries, not {len(config)}"
    for name, value in config.items():
        if name in LAUNCH_OPTIONS:
            continue
        if (why := meta_problem(name, value)) is not None:
            return why
    return launch_problem(config)
