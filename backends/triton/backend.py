"""The Triton backend: each workload's hand-written Triton kernel, launched with a config.

A config names the kernel's meta-parameters and launch options, as JSON scalars::

    {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
    {"BLOCK_N": 1024, "ROWS_PER_PROGRAM": 1, "num_warps": 4, "num_stages": 1}

The backend knows no kernel: ``workloads.<name>.triton`` defines the kernel, its ``space``, its
``default_config`` and ``launch``. The tuner searches the space with its own strategies
(:mod:`tuner.search`); this backend has no search of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from backends.base import Backend, Runnable, Target, import_failure
from backends.triton.settings import INTERPRET_VAR, interpret_enabled
from tunecache.errors import InvalidInput
from tunecache.space import Config, SearchSpace
from workloads.triton_kit.limits import DeviceLimits, current_limits

if TYPE_CHECKING:
    import torch

    from workloads.base import Workload

logger = logging.getLogger(__name__)

INSTALL_HINT = "triton is not installed: pip install 'tunecache[triton]'"
INTERPRETER_NOTE = (
    f"{INTERPRET_VAR}=1: kernels run in Triton's CPU interpreter, for correctness only "
    "(its timings are meaningless); to try a kernel of yours end to end on a CPU, decorate it "
    "with tunecache.triton.autotune (its records keyed to this CPU: docs/integrations.md)"
)


class TritonRunnable:
    """Launches a workload's Triton kernel with one config; picklable, cheap to build.

    It writes into ``out=`` when given one (``takes_out``: validation poisons it with NaN).
    """

    takes_out = True

    def __init__(self, workload: Workload, config: Config) -> None:
        self.workload = workload
        self.config = config
        self._launch: Callable[..., torch.Tensor] | None = None  # resolved at the first call

    def _resolve(self) -> Callable[..., torch.Tensor]:
        """The workload's ``launch``, imported once: a decode kernel runs in about 20 µs, and
        every call's host work shows when it takes longer than that."""
        self._launch = self.workload.triton_launcher()
        return self._launch

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_launch": None}  # a function of a module: imported, not sent

    @property
    def compiles_on_first_call(self) -> bool:
        """On a GPU the first launch compiles (the harness makes it in its parallel build)."""
        return not interpret_enabled()

    def __call__(self, *inputs: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The output for ``inputs`` (on the inputs' device).

        Without the interpreter, CPU inputs are copied to the GPU and the output back, so
        correctness checks can pass CPU tensors; timing should pass CUDA tensors.
        """
        launch = self._launch or self._resolve()
        kwargs = {} if out is None else {"out": out}
        if all(t.is_cuda for t in inputs) or interpret_enabled():
            return launch(self.config, *inputs, **kwargs)
        if out is not None:  # the GPU buffer starts as a copy of ``out`` (its poison too)
            kwargs["out"] = out.cuda()
        result = launch(self.config, *(t.cuda() for t in inputs), **kwargs)
        return result.cpu() if out is None else out.copy_(result)

    def __repr__(self) -> str:
        return f"TritonRunnable({self.workload.name}, {self.config})"


class TritonBackend(Backend):
    """Launches each workload's Triton kernel with configs drawn from its pruned space.

    Example:
        >>> from workloads import get_workload
        >>> backend, matmul = TritonBackend(), get_workload("matmul")
        >>> problem = {"M": 64, "N": 64, "K": 64}
        >>> space = backend.space(matmul, problem, "float16")
        >>> config = matmul.default_config("triton", problem, "float16")
        >>> run = backend.build(matmul, problem, "float16", config)  # doctest: +SKIP
        >>> out = run(*matmul.make_inputs(problem, "float16", seed=0))  # doctest: +SKIP
    """

    name: ClassVar[str] = "triton"

    def unavailable_reason(self) -> str | None:
        """``None`` when Triton imports and there is a CUDA GPU or ``TRITON_INTERPRET=1``."""
        if (failure := import_failure(("torch", "triton"), "triton", INSTALL_HINT)) is not None:
            return failure
        import torch

        from workloads.triton_kit.jit import mode_mismatch

        try:
            if (mismatch := mode_mismatch()) is not None:
                return mismatch
            if torch.cuda.is_available() or interpret_enabled():
                return None
        except ValueError as exc:
            return str(exc)
        return (
            f"no CUDA GPU; set {INTERPRET_VAR}=1 to run the kernels in Triton's CPU interpreter "
            "(correct results, meaningless timings)"
        )

    def measures_meaningfully(self) -> str | None:
        """Why timings taken here mean nothing (the interpreter), or ``None`` on a GPU."""
        return INTERPRETER_NOTE if interpret_enabled() else None

    def device(self) -> str:
        """``"cuda"``, or ``"cpu"`` under the interpreter."""
        return "cpu" if interpret_enabled() else "cuda"

    def space(
        self,
        workload: Workload,
        problem: Mapping[str, int],
        dtype: str,
        limits: DeviceLimits | None = None,
    ) -> SearchSpace:
        """The workload's Triton space at ``problem``, pruned for ``limits`` (by default this
        CUDA device's, or the H100-like ``CPU_INTERPRETER`` preset without one).

        Raises:
            InvalidInput: the workload has no Triton kernel, or ``problem``/``dtype`` are bad.
        """
        workload.check_dtype(dtype, self.name)
        return workload.triton_space(workload.problem(problem), dtype, limits or current_limits())

    def build(
        self, workload: Workload, problem: Mapping[str, int], dtype: str, config: Mapping[str, Any]
    ) -> Runnable:
        """A runnable launching the workload's kernel with ``config`` (nothing compiles yet).

        Raises:
            InvalidInput: ``config`` is outside the workload's space at ``problem`` on this
                device (unknown parameters, or pruned: the reason is in the message).
        """
        space = self.space(workload, problem, dtype)
        chosen = space.complete(Config.from_json(config))  # records older than a parameter
        reason = space.prune_reason(chosen)
        if reason is not None:
            raise InvalidInput(f"triton config {chosen} for {workload.name}: {reason}")
        return TritonRunnable(workload, chosen)

    def compile_target(self) -> Target | None:
        """This CUDA device's architecture and limits (the compile farm's target), or ``None``
        under the interpreter and without a GPU."""
        import torch

        if interpret_enabled() or not torch.cuda.is_available():
            return None
        from tunecache.device import local_device

        device = local_device("cuda")
        return Target("cuda", device.fingerprint.arch, current_limits())

    def compile_ahead(
        self,
        workload: Workload,
        problem: Mapping[str, int],
        dtype: str,
        config: Mapping[str, Any],
        target: Target,
    ) -> dict[str, int]:
        """Compiles ``config``'s kernels for ``target`` into Triton's cache, where the timing
        process's first launch finds them (:mod:`backends.triton.ahead`).

        Raises:
            InvalidInput: ``config`` is outside the space for ``target``'s limits.
        """
        from backends.triton.ahead import compile_for

        space = self.space(workload, problem, dtype, target.limits)
        chosen = space.complete(Config.from_json(config))
        if (reason := space.prune_reason(chosen)) is not None:
            raise InvalidInput(f"triton config {chosen} for {workload.name}: {reason}")
        return compile_for(workload, workload.problem(problem), dtype, chosen, target)

    def out_of_resources(self, exc: BaseException) -> str | None:
        """Triton's ``OutOfResources``: raised as a compiled kernel loads, when it needs more
        shared memory, or (through its registers) more threads, than the device gives one
        block; nothing was launched."""
        from triton.runtime.errors import OutOfResources

        if isinstance(exc, OutOfResources):
            return f"{exc} (found as the kernel loaded; never launched)"
        return None

    def compiles(self) -> int | None:
        """Triton compiles this process has run (cache hits do not count); counting starts at
        the first call."""
        if interpret_enabled():
            return 0
        from backends.triton.ahead import compiles, count_compiles

        count_compiles()
        return compiles()["compiled"]

    def summarize(self, config: Mapping[str, Any]) -> str:
        """``128x256x64 g8 w8 s3`` for GEMMs (``16x64x128 g8 k4 w4 s3`` splitting K 4 ways),
        ``block 1024 r1 w4 s1`` for row kernels."""
        c = dict(config)
        tail = f"w{c.get('num_warps', '?')} s{c.get('num_stages', '?')}"
        if "BLOCK_M" in c:
            tiles = f"{c['BLOCK_M']}x{c.get('BLOCK_N', '?')}x{c.get('BLOCK_K', '?')}"
            split = f" k{c['SPLIT_K']}" if c.get("SPLIT_K", 1) != 1 else ""
            return f"{tiles} g{c.get('GROUP_M', 1)}{split} {tail}"
        if "BLOCK_N" in c:
            return f"block {c['BLOCK_N']} r{c.get('ROWS_PER_PROGRAM', 1)} {tail}"
        return " ".join(f"{k}={v}" for k, v in sorted(c.items())) or "default"
