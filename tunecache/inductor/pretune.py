"""One max-autotune compile of a torch function or module, checked, timed, its choices kept.

:func:`pretune` compiles in a fresh private Inductor cache directory (``fresh_cache``), so every
GEMM is benchmarked and Inductor's choice file ends up holding exactly this compile's choices;
Triton kernels' best configs (CUDA) are recorded through the autotune remote cache
(:mod:`tunecache.inductor.autotune`, in record-only mode). On CPU it compiles with
``freezing``: Inductor benchmarks CPU GEMM choices only against frozen (constant) weights.

The compiled output is checked against eager execution in float64 where the ops allow it (a
float64 copy of the module and inputs), else against eager in the same dtype, with the dtype's
tolerance from :data:`tunecache.defaults.TOLERANCES`.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tunecache.defaults import TOLERANCES
from tunecache.inductor.autotune import AutotuneStore, installed
from tunecache.inductor.choices import ChoiceGroup, local_cache_path, read_groups
from tunecache.interleave import Compared, compare
from tunecache.timing import TimerSettings, time_cpu, time_cuda


@dataclass(frozen=True)
class Check:
    """Relative error ``‖out − ref‖ / ‖ref‖`` of the compiled output against ``reference``."""

    error: float
    tolerance: float
    reference: str  # "float64 eager" or "float32 eager" …

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance


@dataclass(frozen=True)
class PretuneResult:
    """What one max-autotune compile found."""

    device: str
    compile_s: float  # the first compiled call: trace, autotune, compile and run
    compiled_ms: float
    eager_ms: float
    versus_eager: Compared  # eager and compiled timed in alternating rounds
    check: Check
    groups: list[ChoiceGroup]  # GEMM choice timings
    best_configs: dict[str, dict[str, Any]]  # Triton best configs (CUDA)
    output: Any  # the compiled call's output


def _tensors(value: Any) -> list[Any]:
    """The tensors in an output (a tensor, or nested tuples/lists/dicts of them), in order."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for key in sorted(value, key=str) for t in _tensors(value[key])]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _tensors(item)]
    return []


def relative_error(output: Any, reference: Any) -> float:
    """``‖out − ref‖ / ‖ref‖`` over every tensor of the outputs, in float64 (inf on a mismatch)."""
    outs, refs = _tensors(output), _tensors(reference)
    if not outs or len(outs) != len(refs):
        return math.inf
    pairs = list(zip(outs, refs, strict=True))
    if any(o.shape != r.shape for o, r in pairs):
        return math.inf
    diff = sum(float((o.double() - r.double()).square().sum()) for o, r in pairs)
    norm = sum(float(r.double().square().sum()) for r in refs)
    if not math.isfinite(diff):
        return math.inf
    return math.sqrt(diff) / max(math.sqrt(norm), 1e-30)


def _float64(value: Any) -> Any:
    import torch

    if isinstance(value, torch.nn.Module):
        return copy.deepcopy(value).to(torch.float64)
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(torch.float64)
    return value


def check_output(fn: Callable[..., Any], inputs: Sequence[Any], output: Any, eager: Any) -> Check:
    """Compares ``output`` with ``fn`` run in float64, or with ``eager`` if float64 fails."""
    tensors = _tensors(output)
    dtype = str(tensors[0].dtype).removeprefix("torch.") if tensors else "float32"
    tolerance = TOLERANCES.get(dtype, 0.0)
    try:
        reference = _float64(fn)(*[_float64(x) for x in inputs])
        label = "float64 eager"
    except Exception:  # an op without a float64 kernel: compare in the model's own dtype
        reference, label = eager, f"{dtype} eager"
    return Check(relative_error(output, reference), tolerance, label)


def _compile_patches(device: str) -> dict[str, Any]:
    from torch._inductor import config

    wanted: dict[str, Any] = {
        "autotune_local_cache": True,  # where the GEMM choices are read back from
        "autotune_num_choices_displayed": 0,  # the report prints a summary instead
        "max_autotune_report_choices_stats": False,
    }
    if device == "cpu":
        wanted["freezing"] = True
        wanted["freezing_discard_parameters"] = False  # eager is timed after the compile
    else:
        # Triton kernels compiled in Inductor's worker processes never reach the autotune
        # remote cache (the backend override lives in this process): compile them here.
        wanted["compile_threads"] = 1
    return {name: value for name, value in wanted.items() if hasattr(config, name)}


@contextlib.contextmanager
def _fresh_inductor_cache() -> Iterator[None]:
    from torch._inductor import utils

    fresh = getattr(utils, "fresh_cache", None) or utils.fresh_inductor_cache
    with fresh(), warnings.catch_warnings():
        # select_algorithm sizes CPU benchmark outputs through the deprecated TypedStorage API.
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
        yield


def _timer(device: str) -> Callable[..., Any]:
    return time_cuda if device == "cuda" else time_cpu


def pretune(
    fn: Callable[..., Any], inputs: Sequence[Any], *, device: str, timer: TimerSettings
) -> PretuneResult:
    """Compiles ``fn`` with max-autotune, checks and times it, and returns what was chosen.

    Args:
        fn: a function or an ``nn.Module`` (in eval mode), on ``device`` like ``inputs``.
        inputs: the call's arguments.
        device: ``cpu`` or ``cuda``.
        timer: how long to time the compiled and the eager call (each, in every one of
            :data:`~tunecache.interleave.ROUNDS` alternating rounds, more up to
            :data:`~tunecache.interleave.MAX_ROUNDS` while fewer than three were undisturbed).
    """
    import torch
    from torch._inductor import config

    store = AutotuneStore(team=None, read=False)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.no_grad():
        eager = fn(*inputs)
        with _fresh_inductor_cache(), installed(store), config.patch(_compile_patches(device)):
            compiled = torch.compile(fn, mode="max-autotune")
            start = time.perf_counter()
            output = compiled(*inputs)
            sync()
            compile_s = time.perf_counter() - start
            groups = read_groups(local_cache_path())
            time_it = _timer(device)
            versus = compare(
                lambda: time_it(lambda: fn(*inputs), timer).median_ms,
                lambda: time_it(lambda: compiled(*inputs), timer).median_ms,
            )
        check = check_output(fn, inputs, output, eager)
    return PretuneResult(device, compile_s, versus.tuned_ms, versus.baseline_ms, versus, check,
                         groups, dict(store.recorded), output)  # fmt: skip
