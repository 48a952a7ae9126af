"""What a measurement worker needs to know about one key: kernel, backend, problem, device.

A :class:`Task` is plain data so it can cross a process boundary as JSON; the worker resolves the
backend by registry name (``"tvm"``) or by ``"module:Class"`` (how tests plug in a backend whose
candidates crash on purpose), the kernel by built-in name or ``"module:QualName"``. One harness
serves many tasks: each request names its task, and a worker sets a task up once.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from backends import Backend, get_backend
from backends.base import Target
from tunecache.canonical import digest
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
class Task:
    """One key's measurement setup, shared by every candidate of its search.

    Attributes:
        timer: how long and how often to time.
        timer_ref: ``"module:function"`` of a timer ``(fn, settings) -> TimingModel`` to use
            instead of the device's (tests time interpreter kernels this way); ``None``: CUDA
            events on ``cuda``, ``perf_counter`` on ``cpu``.
        target: what candidates compile for in the harness's compile farm, ahead of the one
            process that times them (:meth:`backends.base.Backend.compile_target`); ``None``:
            each candidate compiles in the worker that times it.
    """

    backend: str
    workload: str
    problem: dict[str, Any]
    dtype: str
    device: str = "cpu"  # "cpu" or "cuda"
    seed: int = 1  # inputs for the correctness check and the timing; never zeros
    timer: TimerSettings = field(default_factory=TimerSettings)
    timer_ref: str | None = None
    target: Target | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Task:
        target = data.get("target")
        return cls(**{**data, "timer": TimerSettings(**data["timer"]),
                      "target": None if target is None else Target.from_json(target)})  # fmt: skip

    def at_edge(self) -> Task | None:
        """This task at its workload's edge problem (validation's odd sizes), or ``None``."""
        from workloads import get_workload

        edge = get_workload(self.workload).edge_problem(self.problem)
        return None if edge is None else replace(self, problem=dict(edge))

    def digest(self) -> str:
        """The task's identity (what a worker caches its set-up and builds under)."""
        return digest(self.to_json())
