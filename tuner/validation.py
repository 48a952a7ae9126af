"""Correctness against the float64 golden reference.

Every check uses fresh seeded random non-zero inputs, compares ‖out − ref‖ / ‖ref‖ with the
workload's tolerance for the dtype, and fails on NaN, a wrong shape or an exception. A runnable
that writes into an output buffer (``takes_out``) gets one filled with NaN before each run, so an
element it never writes fails the check. A winner is checked on several seeds and on the
workload's edge problem (odd sizes, not a multiple of a tile).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from tunecache.closeness import relative_errors
from tunecache.schemas import CheckModel, ValidationReport
from tunecache.strict import printable_text

if TYPE_CHECKING:
    import torch

    from backends.base import Runnable
    from workloads.base import Workload

logger = logging.getLogger(__name__)
DEFAULT_SEEDS = (1, 2, 3)


def compare(out: torch.Tensor, ref: torch.Tensor) -> tuple[float | None, float | None, str]:
    """``(relative error, max abs error, note)``; errors are ``None`` when not comparable."""
    import torch

    if not isinstance(out, torch.Tensor):
        return None, None, f"returned {type(out).__name__}, not a tensor"
    if tuple(out.shape) != tuple(ref.shape):
        return None, None, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    errors = relative_errors(out, ref.to(out.device))
    if errors is None:
        return None, None, "output has NaN or inf"
    return errors[0], errors[1], ""


def reference_on(workload: Workload, inputs: Sequence[torch.Tensor], device: str) -> torch.Tensor:
    """The float64 reference of ``inputs`` (CPU tensors) computed on ``device``.

    On a GPU a float64 GEMM takes milliseconds where the CPU takes seconds; a reference that
    cannot run there (a user's numpy code, say) is computed on the CPU instead.
    """
    if device != "cpu":
        try:
            return workload.reference(*(t.to(device) for t in inputs))
        except Exception:
            logger.debug("%s: reference on %s failed; on the CPU", workload.name, device,
                         exc_info=True)  # fmt: skip
    return workload.reference(*inputs)


def run_poisoned(
    runnable: Runnable, inputs: Sequence[torch.Tensor], shape: tuple[int, ...], dtype: str
) -> torch.Tensor:
    """``runnable(*inputs)``, into a NaN-filled output buffer where the runnable takes one."""
    if not getattr(runnable, "takes_out", False):
        return runnable(*inputs)
    import torch

    from workloads.base import torch_dtype

    device = inputs[0].device if inputs else "cpu"
    out = torch.full(shape, float("nan"), dtype=torch_dtype(dtype), device=device)
    return runnable(*inputs, out=out)


def check(
    runnable: Runnable,
    workload: Workload,
    problem: Mapping[str, int],
    dtype: str,
    seed: int,
    device: str = "cpu",
) -> CheckModel:
    """Runs ``runnable`` on seeded inputs (moved to ``device``) and compares with the reference."""
    tolerance = workload.tolerance(dtype)
    inputs = workload.make_inputs(problem, dtype, seed)
    ref = reference_on(workload, inputs, device)
    try:
        shape = workload.output_shape(problem)
        out = run_poisoned(runnable, [t.to(device) for t in inputs], shape, dtype)
        rel, max_abs, note = compare(out.to(ref.device), ref)
    except Exception as exc:  # a candidate may fail in any way; that is a failed check
        logger.debug("candidate raised on %s seed %d", dict(problem), seed, exc_info=True)
        rel, max_abs, note = None, None, printable_text(f"raised {type(exc).__name__}: {exc}", 500)
    return CheckModel(
        problem=dict(problem),
        seed=seed,
        rel_error=rel,
        max_abs_error=max_abs,
        tolerance=tolerance,
        passed=rel is not None and rel <= tolerance,
        note=note,
    )


def validate(
    build: Callable[[Mapping[str, int]], Runnable],
    workload: Workload,
    problem: Mapping[str, int],
    dtype: str,
    *,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    edge: bool = True,
    device: str = "cpu",
) -> ValidationReport:
    """Checks a config on ``seeds`` at ``problem`` and once at the workload's edge problem.

    Args:
        build: makes the runnable for a problem (called once per distinct problem).
    """
    problems: list[Mapping[str, int]] = [problem]
    edge_problem = workload.edge_problem(problem) if edge else None
    if edge_problem is not None:
        problems.append(edge_problem)
    checks: list[CheckModel] = []
    for i, p in enumerate(problems):
        try:
            runnable = build(p)
        except Exception as exc:
            note = printable_text(f"build failed: {type(exc).__name__}: {exc}", 500)
            checks.append(
                CheckModel(
                    problem=dict(p),
                    seed=seeds[0],
                    rel_error=None,
                    max_abs_error=None,
                    tolerance=workload.tolerance(dtype),
                    passed=False,
                    note=note,
                )
            )
            continue
        for seed in seeds if i == 0 else seeds[:1]:
            checks.append(check(runnable, workload, p, dtype, seed, device))
    errors = [c.rel_error for c in checks]
    worst = None if None in errors else max(e for e in errors if e is not None)
    return ValidationReport(
        passed=all(c.passed for c in checks),
        tolerance=workload.tolerance(dtype),
        max_rel_error=worst,
        checks=checks,
    )


MAX_PLACES = 4  # checks named per kind of failure in a summary


def _place(check: CheckModel) -> str:
    """``M=64 seed 1``."""
    return " ".join([",".join(f"{k}={v}" for k, v in check.problem.items()), f"seed {check.seed}"])


def failure_summary(report: ValidationReport, kinds: int = 3) -> str:
    """What failed in ``report``, on one line: each kind of failure (a relative error over the
    tolerance; else a note, by its first line) with how many of the checks failed so and where.

    Example: ``rel error 0.51 > tolerance 0.0001 on 4 of 4 checks (M=64 seed 1, M=64 seed 2,
    M=64 seed 3, M=63 seed 1)``; ``raised ValueError: odd M on 1 of 4 checks (M=63 seed 1)``.
    """
    groups: dict[str, list[CheckModel]] = {}
    for c in report.checks:
        if not c.passed:
            over = c.rel_error is not None and not c.note  # compared, and off
            what = "" if over else (c.failure().strip().splitlines() or ["failed"])[0]
            groups.setdefault(what, []).append(c)
    parts: list[str] = []
    for what, failed in list(groups.items())[:kinds]:
        if not what:
            worst = max(c.rel_error or 0.0 for c in failed)
            what = f"rel error {worst:.2g} > tolerance {failed[0].tolerance:g}"
        places = ", ".join(_place(c) for c in failed[:MAX_PLACES])
        places += ", ..." if len(failed) > MAX_PLACES else ""
        parts.append(f"{what} on {len(failed)} of {len(report.checks)} checks ({places})")
    more = len(groups) - kinds
    return "; ".join(parts) + (f"; {more} more kinds of failure" if more > 0 else "") or "failed"
