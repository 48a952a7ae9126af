"""What a measurement worker needs to know once: which kernel, backend, problem and device.

A :class:`Job` is plain data so it can cross a process boundary as JSON; the worker resolves the
backend by registry name (``"tvm"``) or by ``"module:Class"`` (how tests plug in a backend whose
candidates crash on purpose).
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field
from typing import Any

from backends import Backend, get_backend
from tunecache.errors import InvalidInput
from tunecache.timing import TimerSettings


def resolve_backend(ref: str) -> Backend:
    """A backend by registry name, or by ``"package.module:Class"``.

    Raises:
        InvalidInput: the name is unknown or the class cannot be imported.
    """
    if ":" not in ref:
        return get_backend(ref)
    module, _, name = ref.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise InvalidInput(f"cannot import backend {ref!r}: {exc}") from None
    backend: Backend = cls()
    return backend


@dataclass(frozen=True)
class Job:
    """One key's measurement setup, shared by every candidate of a search."""

    backend: str
    workload: str
    problem: dict[str, int]
    dtype: str
    device: str = "cpu"  # "cpu" or "cuda"
    seed: int = 1  # inputs for the correctness check and the timing; never zeros
    timer: TimerSettings = field(default_factory=TimerSettings)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        return cls(**{**data, "timer": TimerSettings(**data["timer"])})
