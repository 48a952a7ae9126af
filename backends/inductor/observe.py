"""Observing Inductor's autotuning: every benchmarked choice and its time, and a CPU timer.

:class:`ChoiceObserver` registers a feedback saver with
``torch._inductor.select_algorithm.add_feedback_saver`` while a compile runs. Inductor calls it once
per autotuned op with ``(timings, name, input_nodes, choices, ...)``; the trailing arguments differ
between torch versions (4 in 2.5, 6 in 2.13), so only the first two are read. There is no public
"remove" for one saver (``clear_feedback_savers`` drops everyone's), so the observer removes its own
function from the selector cache's ``feedback_saver_fns`` list when it is done.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tunecache import conditions

logger = logging.getLogger(__name__)

_INDEX_SUFFIX = re.compile(r"_\d+$")  # "cpp_CppMicroGemmFP32Vec_3": the 3 is a global counter
_BACKEND_BY_CLASS = {
    "ExternKernelCaller": "ATEN",
    "CppTemplateCaller": "CPP",
    "TritonTemplateCaller": "TRITON",
    "CUTLASSTemplateCaller": "CUTLASS",
    "CUDATemplateCaller": "CUTLASS",
    "ROCmTemplateCaller": "CK",
}


@dataclass(frozen=True)
class ChoiceTiming:
    """One benchmarked choice: a stable name, its GEMM backend (if known) and its time."""

    name: str
    backend: str | None
    ms: float  # inf when the benchmark failed


@dataclass
class AutotunedOp:
    """One op Inductor autotuned (``packed_linear``, ``mm``…) and its choices, fastest first."""

    op: str
    choices: list[ChoiceTiming] = field(default_factory=list)

    @property
    def winner(self) -> ChoiceTiming | None:
        """The choice Inductor picks: the fastest finite timing."""
        finite = [c for c in self.choices if math.isfinite(c.ms)]
        return min(finite, key=lambda c: c.ms) if finite else None


def choice_backend(choice: Any) -> str | None:
    """``ATEN`` / ``CPP`` / ``TRITON`` … for a ``ChoiceCaller`` (wrappers are looked through)."""
    # DataProcessorChoiceCallerWrapper forwards attributes; its own __dict__ holds the wrapped one.
    unwrapped = getattr(choice, "__dict__", {}).get("_wrapped", choice)
    for cls in type(unwrapped).__mro__:
        if cls.__name__ in _BACKEND_BY_CLASS:
            return _BACKEND_BY_CLASS[cls.__name__]
    return None


def choice_name(choice: Any) -> str:
    """A name stable across compiles: the caller's name without its counter, plus description."""
    name = _INDEX_SUFFIX.sub("", str(getattr(choice, "name", type(choice).__name__)))
    description = str(getattr(choice, "description", "") or "")
    return f"{name} {description}" if description else name


class ChoiceObserver:
    """Collects every autotuned op's choice timings while installed (a context manager)."""

    def __init__(self) -> None:
        self.ops: list[AutotunedOp] = []

    def _save(self, timings: dict[Any, float], name: str, *_rest: Any) -> None:
        op = AutotunedOp(op=str(name))
        seen: set[str] = set()
        for choice, ms in timings.items():
            label = choice_name(choice)
            suffix = 2
            while label in seen:  # two callers with one name: keep both
                label = f"{choice_name(choice)}#{suffix}"
                suffix += 1
            seen.add(label)
            op.choices.append(ChoiceTiming(label, choice_backend(choice), float(ms)))
        op.choices.sort(key=lambda c: c.ms)
        logger.info(
            "autotuned %s: %s",
            op.op,
            ", ".join(f"{c.name} {c.ms:.4g} ms" for c in op.choices),
        )
        self.ops.append(op)

    @contextmanager
    def installed(self) -> Iterator[ChoiceObserver]:
        """Registers the feedback saver for the body, then removes exactly this one."""
        from torch._inductor import select_algorithm

        select_algorithm.add_feedback_saver(self._save)
        try:
            yield self
        finally:
            cache = getattr(select_algorithm, "_ALGORITHM_SELECTOR_CACHE", None)
            savers = getattr(cache, "feedback_saver_fns", None)
            if isinstance(savers, list):
                savers[:] = [fn for fn in savers if fn != self._save]
            else:  # an unknown layout: leave the saver; it only appends to this observer
                logger.debug("could not unregister the Inductor feedback saver")


def other_load(since: conditions.Snapshot) -> float | None:
    """How many cores other processes kept busy since ``since`` (a
    ``conditions.snapshot(family=True)``), when that is over ``conditions.NOISY_OTHERS``, else
    ``None``. This process's own compile pool is not another process.

    Inductor's CPU kernels use every core (OpenMP); another busy process stalls their parallel
    regions by whole scheduler slices (a 0.05 ms GEMM measures 10-16 ms), so a search run beside
    one reports it.
    """
    reading = conditions.between(since, conditions.snapshot(family=True))
    if reading.others_cpu is None or reading.others_cpu <= conditions.NOISY_OTHERS:
        return None
    return reading.others_cpu
