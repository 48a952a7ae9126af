"""The Inductor backend: ``torch.compile(mode="max-autotune")`` on CPU, with frozen weights.

On CPU, Inductor benchmarks GEMM choices (the ``_mkl_linear`` extern kernel against the C++ GEMM
template) only when ``torch._inductor.config.freezing`` is on and the GEMM's second operand is a
constant module parameter: the template needs a prepacked constant weight (``use_cpp_gemm_template``
requires ``mat2.is_module_buffer()``). The search therefore compiles the workload's ``torch_fn``
inside a small module whose parameters are the workload's weights (every input after the first;
see :mod:`backends.inductor.runnable`), under ``torch.no_grad()``, with max-autotune and freezing,
the FX-graph, AOTAutograd and autotune caches off (every choice is benchmarked, never read back),
and observes every choice's time with a feedback saver (:mod:`backends.inductor.search`).

Configs are JSON data::

    {"mode": "default"}
    {"mode": "max-autotune", "freezing": true, "frozen": [1], "op": "packed_linear",
     "choice": "cpp_CppMicroGemmFP32Vec", "backend": "CPP",
     "choices": {"cpp_CppMicroGemmFP32Vec": 0.0098, "_mkl_linear": 0.021},
     "retimed": {"cpp_CppMicroGemmFP32Vec": 0.031, "_mkl_linear": 0.045}}
    {"mode": "max-autotune", "freezing": true, "frozen": [], "choice": "fused-cpp"}

``choices`` holds Inductor's kernel benchmarks (ms), ``retimed`` the end-to-end times of the pinned
candidates. ``backend`` pins ``max_autotune_gemm_backends`` when a build compiles (new weights, the
edge problem), so a rebuild compiles the chosen kernel without benchmarking again. ``fused-cpp``
means no op was autotuned: the config is the code Inductor generates under these settings.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends.base import Backend, Budget, Runnable, SearchRequest, SearchResult
from backends.inductor.options import MODE_DEFAULT, MODE_MAX_AUTOTUNE
from backends.inductor.runnable import InductorRunnable, default_frozen_inputs
from backends.inductor.search import MAX_RETIMED, STRATEGY, run_search, summarize_config
from tunecache.errors import InvalidInput

if TYPE_CHECKING:
    from workloads.base import Workload

logger = logging.getLogger(__name__)

MIN_TORCH = (2, 5)

__all__ = ["InductorBackend", "InductorRunnable"]


def _version_tuple(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


class InductorBackend(Backend):
    """Tunes a workload's ``torch_fn`` with Inductor's max-autotune on CPU."""

    name = "inductor"
    native_strategy = STRATEGY

    def unavailable_reason(self) -> str | None:
        """``None`` when torch ≥ 2.5 and its Inductor import, else why not."""
        try:
            import torch
        except ImportError as exc:
            return f"torch is not installed ({exc})"
        if _version_tuple(torch.__version__) < MIN_TORCH:
            return f"torch {torch.__version__} is older than 2.5"
        try:
            import torch._inductor.config
        except Exception as exc:  # a broken install fails in many ways
            return f"torch._inductor cannot be imported: {type(exc).__name__}: {exc}"
        return None

    def budget_text(self, budget: Budget) -> str:
        """Inductor benchmarks the choices it has: the budget caps only the re-timed ones."""
        retimed = min(MAX_RETIMED, budget.trials)
        then = f"up to {retimed} of its choices re-timed end to end" if retimed > 1 else "its pick"
        unbounded = "; not bounded by a time budget" if budget.seconds else ""
        return f"one max-autotune compile, then {then}{unbounded}"

    def search(self, request: SearchRequest, *, workdir: Path) -> SearchResult:
        """One max-autotune compile with freezing; every choice Inductor benchmarks is a trial.

        Trials carry Inductor's benchmark of each choice's kernel; with no autotuned op (softmax,
        layernorm on CPU) there is one trial, the compiled call timed here. Pinned candidates
        are re-timed end to end before the winner is named (``budget.trials`` caps how many;
        ``budget.seconds`` is not enforced). A failed compile returns the default config with
        one ``compile_error`` trial and no runnable; where ``torch_fn`` itself raises, the
        search raises :class:`~tunecache.errors.TuningError` saying what it raised. The search
        leaves ``workdir/inductor_search.json`` behind.
        """
        workload = request.workload
        return run_search(
            workload,
            request.problem,
            request.dtype,
            request.budget,
            workdir,
            request.progress,
            fallback=lambda: workload.default_config(self.name),
        )

    def build(
        self, workload: Workload, problem: Mapping[str, int], dtype: str, config: Mapping[str, Any]
    ) -> Runnable:
        """A runnable for ``config``; it compiles on its first call and on each new weight set.

        Raises:
            InvalidInput: ``config`` is not an Inductor config, or names inputs the workload
                does not have.
        """
        mode = config.get("mode")
        if mode == MODE_DEFAULT:
            return InductorRunnable(workload.torch_fn, {"mode": MODE_DEFAULT}, label=workload.name)
        if mode != MODE_MAX_AUTOTUNE:
            raise InvalidInput(f"inductor config has mode {mode!r}, not default or max-autotune")
        n_inputs = len(workload.input_shapes(problem))
        declared = config.get("frozen")
        if declared is None:
            frozen = default_frozen_inputs(workload, n_inputs)
        elif isinstance(declared, list) and all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n_inputs for i in declared
        ):
            frozen = tuple(sorted(declared))
        else:
            raise InvalidInput(f"inductor config frozen={declared!r}: not a list of input indices")
        return InductorRunnable(workload.torch_fn, config, frozen, label=workload.name)

    def summarize(self, config: Mapping[str, Any]) -> str:
        """``default``, or ``max-autotune: cpp_CppMicroGemmFP32Vec (0.0098 ms) of 2 choices``."""
        return summarize_config(config)
