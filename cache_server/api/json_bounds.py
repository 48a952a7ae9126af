"""A JSON body is parsed off the event loop (:func:`parse_json_off_loop`, in a worker thread)
with bounds on its nesting depth and element count, so a small body cannot expand into millions
of objects (``[{},{},…]``: 3 bytes each). Its bytes were bounded before (:mod:`.limits`).
A body is UTF-8, and no object in it names a field twice (:class:`NotPlain`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import anyio

from tunecache.problem import describe


class TooComplex(ValueError):
    """A JSON body nested deeper, or holding more elements, than the server takes."""


class NotPlain(ValueError):
    """A JSON body an object of which names a field twice: parsers disagree on which one holds
    (Python's keeps the last; a proxy's or an auditor's may keep the first), so what one of them
    read was not what the server stored."""


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's fields, each named once (``object_pairs_hook``)."""
    fields = dict(pairs)
    if len(fields) != len(pairs):
        twice = next(name for name, count in Counter(n for n, _ in pairs).items() if count > 1)
        raise NotPlain(f"an object names the field {describe(twice, 40)} twice")
    return fields


@dataclass(frozen=True)
class JsonLimits:
    """How deep a JSON body may nest and how many values (containers, keys' values, array
    items) it may hold."""

    depth: int = 64
    elements: int = 1_000_000

    def check(self, value: Any) -> None:
        """Raises :class:`TooComplex` when ``value`` (parsed JSON) is over a limit."""
        stack = [(value, 1)]
        count = 0
        while stack:
            node, depth = stack.pop()
            if depth > self.depth:
                raise TooComplex(f"it is nested too deeply (more than {self.depth} levels)")
            children = node.values() if isinstance(node, dict) else node
            count += len(children)
            if count > self.elements:
                raise TooComplex(f"it holds more than {self.elements} values")
            stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))


def parse_json(body: bytes, limits: JsonLimits) -> Any:
    """``body`` parsed, within ``limits``.

    A cheap count of the bytes that open a container or separate values comes first: a body
    with far more of them than ``limits.elements`` is refused before it is parsed (an
    over-estimate: those characters inside strings count too).

    Raises:
        TooComplex: over a limit.
        NotPlain: an object names a field twice.
        json.JSONDecodeError, UnicodeDecodeError, RecursionError: not parsable (the bytes are
            read as UTF-8: ``json.loads`` of bytes took UTF-16 and UTF-32 too).
    """
    structural = body.count(b"{") + body.count(b"[") + body.count(b",")
    if structural > 2 * limits.elements:
        raise TooComplex(f"it holds more than {limits.elements} values")
    # UTF-8, a byte order mark before it left out as json.loads of bytes did
    value = json.loads(body.decode("utf-8-sig"), object_pairs_hook=_once_each)
    if isinstance(value, dict | list):
        limits.check(value)
    return value


async def parse_json_off_loop(body: bytes, limits: JsonLimits) -> Any:
    """:func:`parse_json` in a worker thread: the event loop keeps answering meanwhile."""
    return await anyio.to_thread.run_sync(parse_json, body, limits)
