"""Is this data storable JSON? One walk that every wire model runs before its own validation;
and one parser for JSON from outside (:func:`parse_json`).

A body may hold, anywhere, only what every database stores and every JSON encoder writes back: no
NUL character (PostgreSQL text cannot hold one) or lone UTF-16 surrogate (not Unicode, so not
UTF-8) in a string or a key, no NaN or infinity (Python's JSON parser accepts them; JSON does not),
no integer outside int64, and no nesting deeper than ``MAX_JSON_DEPTH``.

Example:
    >>> json_problem({"a": [1, 2, float("nan")]})
    'body.a[2] is NaN, not a finite number'
    >>> json_problem({"a": "fine"}) is None
    True
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from pydantic_core import from_json

from tunecache.problem import describe

MAX_JSON_DEPTH = 32  # objects and lists within one another, counted from any model's own data
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # any integer anywhere in a body
_ODD_TEXT = re.compile("[\x00\ud800-\udfff]")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]{1,40}")
# A path into the data, built only when an error needs it: (parent, key or index).
_Path = tuple[Any, str | int] | str


def _render(path: _Path) -> str:
    parts: list[str] = []
    while isinstance(path, tuple):
        path, part = path
        if isinstance(part, int):
            parts.append(f"[{part}]")
        else:
            parts.append(f".{part}" if _PLAIN_KEY.fullmatch(part) else f"[{describe(part)}]")
    return path + "".join(reversed(parts))


def _text_problem(text: str) -> str | None:
    if _ODD_TEXT.search(text) is None:
        return None
    if "\x00" in text:
        return "contains a NUL character"  # PostgreSQL text cannot hold one
    return "contains a lone UTF-16 surrogate, which is not Unicode text"  # cannot be UTF-8


def storable_text(text: str, limit: int) -> str:
    """``text`` as a body may hold it, for text from outside (a compiler's or a kernel's message):
    a NUL or lone surrogate becomes U+FFFD, and it is cut to ``limit`` characters.

    Example:
        >>> storable_text("bad\\x00byte", 5)
        'bad\\ufffdb'
    """
    return _ODD_TEXT.sub("\ufffd", text)[:limit]


def _scalar_problem(value: Any) -> str | None:
    if isinstance(value, str):
        return _text_problem(value)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            return f"is {describe(value)}, outside the 64-bit integer range"
    elif isinstance(value, float) and not math.isfinite(value):
        return f"is {_json_token(value)}, not a finite number"
    return None


def _all_plain(values: Collection[Any]) -> bool:
    """Whether ``values`` are all of one scalar type and none needs a look, found at C speed.

    ``False`` only means "look at each": mixed types, containers, or an offender somewhere.
    """
    kinds = set(map(type, values))
    if kinds == {int}:
        return min(values) >= INT64_MIN and max(values) <= INT64_MAX
    if kinds == {str}:
        return _ODD_TEXT.search("".join(values)) is None
    if kinds == {float}:
        return all(map(math.isfinite, values))
    return kinds <= {bool, type(None)}


def json_problem(data: Any, root: str = "body") -> str | None:
    """Why ``data`` cannot be stored and sent back as JSON by every database, or ``None``.

    Walks without recursion, so no nesting depth can overflow the stack: a NUL character or a
    lone surrogate in a string or a key, a NaN or infinity, an integer outside int64, or nesting
    deeper than ``MAX_JSON_DEPTH``. The answer names the path of the first offender. Long runs of
    plain scalars are checked at C speed and paths built only for an answer, so no 16 MiB body
    keeps a server busy for long.
    """
    if not isinstance(data, Mapping | list | tuple):
        why = _scalar_problem(data)
        return None if why is None else f"{root} {why}"
    stack: list[tuple[Any, _Path, int]] = [(data, root, 0)]
    while stack:
        container, path, depth = stack.pop()
        if depth >= MAX_JSON_DEPTH:
            return f"{_render(path)} is nested more than {MAX_JSON_DEPTH} levels deep"
        long = len(container) > 8
        kind = type(container)  # exact types first: ``isinstance(x, Mapping)`` is slow
        if kind is dict or (kind is not list and isinstance(container, Mapping)):
            keys_ok = long and _all_plain(container)  # str keys, as JSON's are
            if keys_ok and _all_plain(container.values()):
                continue
            pairs: Iterable[tuple[Any, Any]] = container.items()
        else:
            keys_ok = True
            if long and _all_plain(container):
                continue
            pairs = enumerate(container)
        children = []
        for key, value in pairs:
            if not keys_ok and isinstance(key, str) and (why := _text_problem(key)) is not None:
                return f"{_render(path)} has a key that {why}"
            kind = type(value)
            if kind is dict or kind is list:
                if value:
                    children.append((value, (path, key), depth + 1))
                elif depth + 1 >= MAX_JSON_DEPTH:  # empty: nothing in it to look at
                    return (
                        f"{_render((path, key))} is nested more than {MAX_JSON_DEPTH} levels deep"
                    )
                continue
            if kind is bool or value is None:
                continue
            if kind is str:
                fine = _ODD_TEXT.search(value) is None
            elif kind is int:
                fine = INT64_MIN <= value <= INT64_MAX
            elif kind is float:
                fine = math.isfinite(value)
            elif isinstance(value, Mapping | list | tuple):
                children.append((value, (path, key), depth + 1))
                continue
            else:  # a subclass, or not JSON at all: the models' own validation says
                fine = False
            if not fine and (why := _scalar_problem(value)) is not None:
                return f"{_render((path, key))} {why}"
        stack.extend(reversed(children))
    return None


def _json_token(value: float) -> str:
    """How a non-finite float was spelled in the (non-standard) JSON it came from."""
    return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"


def parse_json(data: str | bytes) -> Any:
    """JSON from outside (a server's answer, a file anyone may have written), parsed by jiter:
    nesting past its limit raises ``ValueError`` like any malformed JSON. Python's own parser
    recurses, so 20,000 ``[`` raise ``RecursionError``, which no ``except ValueError`` catches.

    Example:
        >>> parse_json(b'{"a": [1, 2]}')
        {'a': [1, 2]}
        >>> parse_json("[" * 20_000 + "]" * 20_000)
        Traceback (most recent call last):
        ...
        ValueError: recursion limit exceeded at line 1 column 202
    """
    return from_json(data)


# A JSON string, escapes and all (unrolled: a 2 MiB string is passed over in 20 ms), or one that
# never ends, to the end of the body: where it had to end, each quote after an unended one started
# the search again, so ``"`` + ``\"`` × 32,000 (64 KB) took 14 s holding the GIL (the process
# stood still, past every deadline). Linear now: every quote's match succeeds.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)


def containers(body: bytes) -> int:
    """How many JSON arrays and objects ``body`` holds (if it is JSON), counted at C speed with
    its strings left out: what :func:`parse`'s ``max_containers`` bounds. Brackets inside
    strings do not count: a write token's record whose check notes held 100,000 of them was
    refused by every consumer, and the server skipped (3 MiB of lists: 50 ms).

    Example:
        >>> containers(b'{"a": [[], {}], "b": "[[{ ]"}')
        4
    """
    return counts(body)[0]


def counts(body: bytes) -> tuple[int, int]:
    """The arrays and objects in ``body``, and an upper bound on its values (each value but a
    container's first follows a comma), its strings left out, an object's member counted as 4
    (a colon): building one took 1.65 µs here, a number 0.2-0.4 µs, an empty list 1 µs."""
    stripped = _JSON_STRING.sub(b"", body)
    held = stripped.count(b"[") + stripped.count(b"{")
    return held, 2 * held + stripped.count(b",") + 3 * stripped.count(b":") + 1


def past_bound(body: bytes, max_containers: int, max_values: int | None = None, *,
               counted: tuple[int, int] | None = None) -> str | None:  # fmt: skip
    """What puts ``body`` past ``max_containers`` JSON arrays and objects (:func:`containers`),
    or past ``max_values`` values of any kind (numbers, strings, containers: each is built as
    a Python object; a flat list of 16 million zeros took 10 s and 1.4 GB to parse), or ``None``
    within them: the one check every answer a client parses passes first. ``counted``: the
    body's :func:`counts`, where the caller has them (one pass over up to 256 MiB, not two).

    Example:
        >>> past_bound(b"[[], []]", 2)
        '3 JSON arrays and objects (or brackets), where at most 2 are read'
        >>> past_bound(b"[0, 0, 0, 0]", 2, max_values=3)
        'about 6 JSON values (an object member counting 4), where at most 3 are read'
    """
    count, values = counts(body) if counted is None else counted
    if count > max_containers:
        return (f"{count:,} JSON arrays and objects (or brackets), where at most "
                f"{max_containers:,} are read")  # fmt: skip
    if max_values is not None and values > max_values:
        return (f"about {values:,} JSON values (an object member counting 4), where at most "
                f"{max_values:,} are read")  # fmt: skip
    return None
