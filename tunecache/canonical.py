"""Canonical JSON and the hashes built on it.

Keys and configs are hashed as canonical JSON — sorted keys, no whitespace, UTF-8, integers kept as
integers — never as ``repr()``, so a hash computed by the client in one process equals the hash the
tuner computed in another, on another machine, in another Python version.

Example:
    >>> canonical_json({"b": 1, "a": [1, 2.5]})
    '{"a":[1,2.5],"b":1}'
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from tunecache.errors import InvalidInput

EXACT_FLOAT_INT = 2**53  # beyond it a float is not the integer that was written
JSONValue = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]


def _plain(value: Any) -> bool:
    """Whether ``value`` is plain JSON data of exact types with string keys and finite numbers,
    found without building a path for each item (a 256 KiB config can hold 80,000 lists).
    ``False`` only means "look again, naming the offender" (:func:`_check`): a subclass, say."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str or kind is int or kind is bool or item is None:
            continue
        if kind is list or kind is tuple:
            stack.extend(item)
        elif kind is dict:
            if not all(type(k) is str for k in item):
                return False
            stack.extend(item.values())
        elif kind is not float or not math.isfinite(item):
            return False
    return True


def _check(value: Any, path: str) -> None:
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput(f"{path}: non-finite float {value!r} has no canonical JSON form")
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check(item, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                raise InvalidInput(f"{path}: object key {k!r} is not a string")
            _check(item, f"{path}.{k}")
        return
    raise InvalidInput(f"{path}: {type(value).__name__} is not JSON data")


def integral(value: Any) -> Any:
    """A JSON number with no fractional part (``14.0``) as the integer it is, else ``value``
    (past 2**53 a float is no longer the integer written: it stays a float, and is refused).

    JSON Schema's ``integer`` admits ``14.0``, so the API does too, wherever it takes an integer
    (as a pydantic ``BeforeValidator``, ahead of a strict ``int``: booleans and strings stay
    refused). Configs keep their numbers as sent: there ``4.0`` is not ``4``.
    """
    if type(value) is float and value.is_integer() and abs(value) <= EXACT_FLOAT_INT:
        return int(value)
    return value


def canonical_json(value: Any) -> str:
    """Serialises JSON data canonically: sorted keys, compact separators, no NaN.

    Raises:
        InvalidInput: ``value`` holds something that is not plain JSON data.
    """
    if not _plain(value):
        _check(value, "$")
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(value: Any) -> str:
    """The SHA-256 hex digest of ``value``'s canonical JSON."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def check_json_size(value: Any, what: str, limit: int) -> Any:
    """``value`` if its canonical JSON is at most ``limit`` bytes (a validator's ValueError if
    not, or if it is not plain JSON data)."""
    try:
        size = len(canonical_json(value).encode())
    except InvalidInput as exc:
        raise ValueError(str(exc)) from None
    if size > limit:
        raise ValueError(f"{what} is {size} bytes; the limit is {limit}")
    return value
