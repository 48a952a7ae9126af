"""Turning TVM objects (ffi Arrays and Maps, IntImm, FloatImm) into plain JSON data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def plain_json(value: Any) -> Any:
    """``value`` with every TVM container and immediate replaced by its Python equivalent.

    Raises:
        TypeError: something in ``value`` has no JSON form (an IR node, a tensor).
    """
    if value is None or isinstance(value, bool | int | float | str):
        return value if not isinstance(value, str) else str(value)
    if isinstance(value, Mapping):
        return {str(k): plain_json(v) for k, v in value.items()}
    if isinstance(value, Sequence):
        return [plain_json(v) for v in value]
    from tvm.tirx import FloatImm, IntImm

    if isinstance(value, IntImm):
        return int(value.value)
    if isinstance(value, FloatImm):
        return float(value.value)
    export = getattr(value, "export", None)  # a nested Target (a target's host)
    if callable(export):
        return plain_json(export())
    raise TypeError(f"{type(value).__name__} has no JSON form: {value!r:.200}")
