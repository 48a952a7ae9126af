"""A JSON body is parsed off the event loop (:func:`parse_json_off_loop`, in a worker thread)
with bounds on its nesting depth and element count, so a small body cannot expand into millions
of objects (``[{},{},…]``: 3 bytes each). Its bytes were bounded before (:mod:`.limits`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import anyio


class TooComplex(ValueError):
    """A JSON body nested deeper, or holding more elements, than the server takes."""


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
        json.JSONDecodeError, UnicodeDecodeError, RecursionError: not parsable.
    """
    structural = body.count(b"{") + body.count(b"[") + body.count(b",")
    if structural > 2 * limits.elements:
        raise TooComplex(f"it holds more than {limits.elements} values")
    value = json.loads(body)
    if isinstance(value, dict | list):
        limits.check(value)
    return value


async def parse_json_off_loop(body: bytes, limits: JsonLimits) -> Any:
    """:func:`parse_json` in a worker thread: the event loop keeps answering meanwhile."""
    return await anyio.to_thread.run_sync(parse_json, body, limits)
