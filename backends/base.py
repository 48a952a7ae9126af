"""The backend interface: a generic engine that searches and builds kernels for any workload.

A backend knows no kernel math. Given a workload, a problem and a dtype it can

* offer an enumerable ``space`` of configs that the tuner searches with its own strategies
  (:mod:`tuner.search`) through the isolating measurement harness, and/or
* ``search`` with a strategy of its own (``native_strategy``: MetaSchedule, Inductor's autotuner)
  under a :class:`Budget` and report every trial, and
* ``build`` a runnable for any config it produced (or the workload's default config).

A runnable takes the workload's CPU input tensors and returns a fresh output tensor.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from tunecache.errors import TuningError
from tunecache.schemas import Trial, TrialStatus

if TYPE_CHECKING:
    import torch

    from tunecache.device import DeviceLimits
    from tunecache.space import SearchSpace
    from workloads.base import Workload

Runnable = Callable[..., "torch.Tensor"]
__all__ = ["Backend", "Budget", "Progress", "ProgressFn", "Runnable", "SearchRequest",
           "SearchResult", "Target", "Trial", "TrialStatus"]  # fmt: skip


@dataclass(frozen=True)
class Budget:
    """How much a tuning run may spend: at most ``trials`` searched configs and ``seconds`` for
    the whole run (search, re-timing, validation, baselines: the search leaves room for the rest),
    whichever comes first."""

    trials: int = 32
    seconds: float | None = None
    patience: int | None = None  # stop early after this many trials without improvement

    def text(self) -> str:
        """``32 trials``, ``200 trials or 20 s``, ``... stopping after 10 without gain``."""
        text = f"{self.trials} trials" + (f" or {self.seconds:g} s" if self.seconds else "")
        return text + (f", stopping after {self.patience} without gain" if self.patience else "")

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise ValueError(f"budget trials must be >= 1, got {self.trials}")
        if self.seconds is not None and not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"budget seconds must be finite and > 0, got {self.seconds}")
        if self.patience is not None and self.patience < 1:
            raise ValueError(f"budget patience must be >= 1, got {self.patience}")


@dataclass(frozen=True)
class Target:
    """What a backend's candidates compile for, when a process without the device can compile
    them (a compile farm ahead of the one process that times): ``cuda`` ``sm_90`` with its
    per-block limits, which a compiled candidate must fit.
    """

    kind: str
    arch: str
    limits: DeviceLimits

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "arch": self.arch, "limits": dataclasses.asdict(self.limits)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Target:
        from tunecache.device import DeviceLimits

        return cls(data["kind"], data["arch"], DeviceLimits(**data["limits"]))


@dataclass(frozen=True)
class Progress:
    """A progress report of a tuning run: its phase, how far it is, the best time so far.

    ``phase`` is ``search``, ``validate``, ``time``, ``upload`` or ``done``; ``total`` is 0 when
    the phase has no count.
    """

    done: int
    total: int
    best_ms: float | None = None
    message: str = ""
    phase: str = "search"


ProgressFn = Callable[[Progress], None]


@dataclass(frozen=True)
class SearchRequest:
    """One search of a backend's own: the kernel, its problem and dtype, the budget, and where
    progress goes."""

    workload: Workload
    problem: Mapping[str, int]
    dtype: str
    budget: Budget
    progress: ProgressFn | None = None
    seed: int = 0  # a search with the same seed, budget and history proposes the same candidates
    # The seconds of the tune's work after the search (re-timing, validation, baselines), from
    # one candidate's build and measurement seconds: a search stops early enough within
    # ``budget.seconds`` to leave them. None: it stops at ``budget.seconds`` itself.
    after: Callable[[float, float], float] | None = None
    # When ``budget.seconds`` began to count, a ``time.monotonic()`` reading: the tune's start,
    # so that starting its workers and asking the cache count. None: when it starts.
    began: float | None = None
    # Whether the tune's measurement workers start after a backend's own search (a daemon's run
    # ones already): then what follows the search takes their start too.
    workers_start: bool = True


@dataclass
class SearchResult:
    """What a search found, one of the tuner's strategies or a backend's own search alike: the
    configs worth validating, best first, every trial it measured, and (optionally) the best
    one's built runnable, a by-product for direct callers (the tuner measures every candidate
    in its workers)."""

    ranked: list[dict[str, Any]]  # best first; empty when nothing it measured ran
    trials: list[Trial]
    strategy: str = ""
    seconds: float = 0.0
    best_ms: float | None = None  # the best time the search measured, where it has one
    runnable: Runnable | None = None
    # Why it measured fewer trials than its budget: "time" (the time budget, the rest kept for
    # what follows the search), "space" (its space gave no new candidate), "" (neither said).
    stopped: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.ranked, list) or not all(isinstance(c, dict) for c in self.ranked):
            raise TypeError(f"SearchResult.ranked: a list of configs (dicts), got {self.ranked!r}")

    @property
    def config(self) -> dict[str, Any]:
        """The best config (``ranked[0]``).

        Raises:
            TuningError: the search found none.
        """
        if not self.ranked:
            raise TuningError(f"the {self.strategy or 'search'} found no config that ran")
        return self.ranked[0]


def import_failure(modules: tuple[str, ...], package: str, hint: str) -> str | None:
    """Why ``modules`` cannot be imported (with the install ``hint``), or ``None`` if they can."""
    import importlib
    import logging

    try:
        for module in modules:
            importlib.import_module(module)
    except ImportError as exc:
        logging.getLogger(__name__).debug("%s is unavailable: %s", package, exc)
        return hint
    except Exception as exc:  # a broken install (missing shared library, ABI mismatch)
        return f"{package} failed to import ({type(exc).__name__}: {exc}); {hint}"
    return None


@runtime_checkable
class CompilesAhead(Protocol):
    """What a backend implements when a CPU-only process can compile its candidates for the
    device ahead of their timing (Triton for an ``sm_90``): the compile farm's side of it
    (:mod:`tuner.harness.farm`). A backend without it compiles where its candidates run."""

    def compile_target(self) -> Target | None:
        """The target to compile for (this process's device), or ``None`` when its candidates
        compile where they run here after all (an interpreter, no device)."""

    def compile_ahead(
        self,
        workload: Workload,
        problem: Mapping[str, int],
        dtype: str,
        config: Mapping[str, Any],
        target: Target,
    ) -> dict[str, int]:
        """Compiles ``config`` for ``target`` in this process, which has no device, leaving the
        result where the backend's runnable will load it from without compiling (a shared
        cache); returns facts about the compiled code (``{"shared": bytes}``).

        Raises:
            InvalidInput: ``config`` is outside the space (the reason is in the message).
            Exception: the compiler's own error.
        """


def compile_target(backend: Backend) -> Target | None:
    """``backend``'s compile-ahead target, or ``None`` when it has none (see
    :class:`CompilesAhead`)."""
    return backend.compile_target() if isinstance(backend, CompilesAhead) else None


class Backend(abc.ABC):
    """A tuning backend (``tvm``, ``inductor``, later ``triton``)."""

    name: ClassVar[str]
    native_strategy: ClassVar[str | None] = None  # the name of ``search``'s own strategy

    @abc.abstractmethod
    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run here (a missing package, no GPU), or ``None``."""

    def space(
        self, workload: Workload, problem: Mapping[str, int], dtype: str
    ) -> SearchSpace | None:
        """The enumerable config space (pruned by device limits), or ``None`` if there is none."""
        return None

    def device(self) -> str:
        """Where this backend's candidates run and are timed: ``"cpu"`` or ``"cuda"``."""
        return "cpu"

    def measures_meaningfully(self) -> str | None:
        """Why timings taken here mean nothing (an interpreter), or ``None`` when they count."""
        return None

    def budget_text(self, budget: Budget) -> str:
        """What ``budget`` means to :meth:`search`, in words (a tune's first line says it)."""
        return budget.text()

    def search(self, request: SearchRequest, *, workdir: Path) -> SearchResult:
        """Searches with ``native_strategy`` and returns the best config.

        Raises:
            NotImplementedError: the backend has no search of its own (only a ``space``).
        """
        raise NotImplementedError(f"{self.name} has no search of its own; use a tuner strategy")

    @abc.abstractmethod
    def build(
        self, workload: Workload, problem: Mapping[str, int], dtype: str, config: Mapping[str, Any]
    ) -> Runnable:
        """A runnable for ``config`` (a config ``search`` returned, or the default config)."""

    def out_of_resources(self, exc: BaseException) -> str | None:
        """Why ``exc``, raised by a candidate's runnable, means the candidate does not fit the
        device, found as its code was loaded and before anything ran (it is recorded
        ``invalid``, like a config pruned by the space), or ``None`` for any other failure."""
        return None

    def compiles(self) -> int | None:
        """How many compiles this process has run for the backend so far (the compile farm's
        check that its timing process compiles nothing), or ``None`` when it does not count."""
        return None

    @abc.abstractmethod
    def summarize(self, config: Mapping[str, Any]) -> str:
        """The config in a few words, for tables (``tiles i=4x8 j=16 k=8, vec 16, par 2``)."""
