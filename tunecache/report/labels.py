"""How a key is named on a figure: ``kernel backend dtype shape``, the arch when it matters.

Records (:class:`tunecache.schemas.KeyModel`) and manifest keys (:class:`tunecache.key.Key`) are
both labelled, so the functions take anything shaped like a key (:class:`KeyLike`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from tunecache.key import Versioned, problem_text


class _HasArch(Protocol):
    @property
    def arch(self) -> str: ...


class KeyLike(Versioned, Protocol):
    """The parts of a key a figure shows (both ``Key`` and ``KeyModel`` have them): its kernel,
    source and backend (:class:`~tunecache.key.Versioned`), and these."""

    @property
    def dtype(self) -> str: ...
    @property
    def problem(self) -> Mapping[str, Any]: ...
    @property
    def device(self) -> _HasArch: ...


def key_label(key: KeyLike, *, with_arch: bool = False) -> str:
    """``"matmul tvm float32 M=64,N=64,K=64"``, then the device arch when ``with_arch``.

    Example:
        >>> from tests.factories import make_key  # doctest: +SKIP
        >>> key_label(make_key(32))  # doctest: +SKIP
        'matmul tvm float32 M=32,N=64,K=64'
    """
    label = f"{key.kernel} {key.backend} {key.dtype} {problem_text(key.problem)}"
    return f"{label} {key.device.arch}" if with_arch else label


def several_archs(keys: Sequence[KeyLike]) -> bool:
    """Whether ``keys`` span more than one device arch (then labels must name it)."""
    return len({key.device.arch for key in keys}) > 1


T = TypeVar("T")


def fair_order(items: Sequence[T], *, label: Callable[[T], str], verified: Callable[[T], bool],
               uploader: Callable[[T], str]) -> list[T]:  # fmt: skip
    """``items`` in the order a figure with too few places keeps them: those a verifier vouches
    for first, then every uploader's in turn (each one's first by name, then each one's second,
    …), by name among equals. Kept by name alone, one write token's keys named to sort first
    (480 uploaded in 3 s) filled every place and left out each teammate's: an uploader cannot
    make its keys verified, nor take another uploader's turn."""
    by_name = sorted(items, key=lambda item: natural(label(item)))
    turns: dict[str, int] = {}
    ranked = []
    for at, item in enumerate(by_name):
        who = uploader(item)
        turns[who] = turn = turns.get(who, -1) + 1
        ranked.append((not verified(item), turn, at, item))
    return [item for *_, item in sorted(ranked, key=lambda ranks: ranks[:3])]


def fair_first(items: Sequence[T], limit: int, *, label: Callable[[T], str],
               verified: Callable[[T], bool], uploader: Callable[[T], str]) -> list[T]:  # fmt: skip
    """At most ``limit`` of ``items`` for a figure (:func:`fair_order`), shown in name order."""
    kept = fair_order(items, label=label, verified=verified, uploader=uploader)[:limit]
    return sorted(kept, key=lambda item: natural(label(item)))


def natural(label: str) -> list[str | int]:
    """A sort key reading digit runs as numbers: ``M=16`` before ``M=128``.

    Example:
        >>> sorted(["M=128", "M=16"], key=natural)
        ['M=16', 'M=128']
    """
    # re.split with a group alternates text and digit runs, so the kinds line up position by
    # position and the lists always compare.
    return [int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", label))]
