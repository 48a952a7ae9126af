"""Knob-parameterised TVM schedules: small, enumerable, AutoTVM-style spaces per workload.

Each workload family has a hand-written TIR schedule template (:mod:`.gemm` for ``matmul`` and
``bias_gelu``, :mod:`.rows` for ``softmax``, ``layernorm`` and ``rmsnorm``) whose choices — tile
sizes, vector width, parallel, unroll — are discrete knobs. A config is plain JSON::

    {"schedule": "knobs", "tile_i": 8, "tile_j": 32, "tile_k": 16,
     "vectorize": true, "parallel": true, "unroll": 16}

:func:`knob_space` enumerates the configs worth measuring at one problem (a
:class:`~tunecache.space.SearchSpace` whose constraint says why each other config is pruned);
:func:`apply_knobs` schedules any config at any problem size, odd ones included: the templates pad
or predicate where a tile does not divide, so a config tuned at 256 also runs correctly at 255.

Importing this package does not import TVM; :func:`apply_knobs` does.

Example:
    >>> from workloads import get_workload
    >>> space = knob_space(get_workload("softmax"), {"M": 512, "N": 1024}, "float32")
    >>> config = next(space.configs())
    >>> mod = apply_knobs(get_workload("softmax"), {"M": 511, "N": 1023}, "float32", config)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends.tvm.knobs import gemm, rows
from tunecache.errors import InvalidInput, TuningError
from tunecache.space import Config, Scalar, SearchSpace

if TYPE_CHECKING:
    from tvm.ir import IRModule
    from tvm.s_tir import Schedule
    from tvm.tirx import PrimFunc

    from workloads.base import Workload

SCHEDULE_KNOBS = "knobs"
_MAX_ERROR = 2000


@dataclass(frozen=True)
class KnobFamily:
    """One schedule template: its knobs, its pruning rule, the schedule itself, its summary."""

    name: str
    params: Mapping[str, tuple[Scalar, ...]]
    default: Mapping[str, Scalar]
    prune_reason: Callable[[Mapping[str, int], Config], str | None]
    schedule: Callable[[PrimFunc, Mapping[str, Any]], Schedule]
    summarize: Callable[[Mapping[str, Any]], str]


GEMM = KnobFamily(
    gemm.NAME, gemm.PARAMS, gemm.DEFAULT, gemm.prune_reason, gemm.schedule, gemm.summarize
)
ROWS = KnobFamily(
    rows.NAME, rows.PARAMS, rows.DEFAULT, rows.prune_reason, rows.schedule, rows.summarize
)
# By family name; a workload names its family in ``Workload.tvm_knobs``.
FAMILIES: dict[str, KnobFamily] = {GEMM.name: GEMM, ROWS.name: ROWS}


def _workload(workload: Workload | str) -> Workload:
    from workloads import get_workload

    return get_workload(workload) if isinstance(workload, str) else workload


def _name(workload: Workload | str) -> str:
    return workload if isinstance(workload, str) else workload.name


def _family_name(workload: Workload | str) -> str | None:
    try:
        return _workload(workload).tvm_knobs
    except InvalidInput:  # an unknown workload has none
        return None


def has_knobs(workload: Workload | str) -> bool:
    """Whether ``workload`` has a knob schedule template."""
    return _family_name(workload) in FAMILIES


def family(workload: Workload | str) -> KnobFamily:
    """The knob family that schedules ``workload``.

    Raises:
        InvalidInput: the workload has no knob schedule (the message lists the families).
    """
    found = _family_name(workload)
    if found is None or found not in FAMILIES:
        raise InvalidInput(
            f"{_name(workload)} has no TVM knob schedule (Workload.tvm_knobs names one of "
            f"{', '.join(sorted(FAMILIES))})"
        )
    return FAMILIES[found]


def knob_space(workload: Workload, problem: Mapping[str, int], dtype: str) -> SearchSpace:
    """Every knob config worth measuring for ``workload`` at ``problem``.

    The space has a one-choice ``schedule`` parameter (``"knobs"``), so its configs are complete
    TVM configs that :meth:`TVMBackend.build <backends.tvm.TVMBackend.build>` takes as they are.
    Its constraint prunes configs that repeat another at this problem (a tile larger than its
    dimension) or that spill (an accumulator tile beyond the register file), with the reason.

    Raises:
        InvalidInput: no knob schedule for this workload, a dtype TVM does not run it in, or a
            malformed problem.
    """
    fam = family(workload)
    workload.check_dtype(dtype, "tvm")
    checked = workload.problem(problem)

    def constraint(config: Config) -> str | None:
        return fam.prune_reason(checked, config)

    return SearchSpace({"schedule": (SCHEDULE_KNOBS,), **fam.params}, constraint=constraint)


def default_knobs(workload: Workload | str) -> dict[str, Scalar]:
    """A reasonable hand-picked knob config for ``workload`` (a starting point, not tuned)."""
    return {"schedule": SCHEDULE_KNOBS, **family(workload).default}


def check_knobs(workload: Workload | str, config: Mapping[str, Any]) -> None:
    """Checks ``config`` names exactly ``workload``'s knobs, each set to one of its choices.

    Size-dependent pruning is not applied: a config valid at one problem builds at any other.

    Raises:
        InvalidInput: another schedule kind, a missing or unknown knob, or a value not offered.
    """
    fam = family(workload)
    if config.get("schedule") != SCHEDULE_KNOBS:
        raise InvalidInput(f"not a knob config: schedule={config.get('schedule')!r}")
    names = set(config) - {"schedule"}
    if names != set(fam.params):
        missing, unknown = sorted(set(fam.params) - names), sorted(names - set(fam.params))
        raise InvalidInput(
            f"{_name(workload)} knob config: missing {missing or 'none'}, unknown"
            f" {unknown or 'none'} (knobs: {', '.join(fam.params)})"
        )
    for name, choices in fam.params.items():
        value = config[name]
        # bool is an int in Python: True must not pass for 1, nor 1 for True.
        if type(value) is not type(choices[0]) or value not in choices:
            raise InvalidInput(f"knob {name}={value!r} is not one of {list(choices)}")


def apply_knobs(
    workload: Workload, problem: Mapping[str, int], dtype: str, config: Mapping[str, Any]
) -> IRModule:
    """``workload``'s TE compute at ``problem``, scheduled by the knob ``config``.

    Any problem size works, whether or not the tiles divide it.

    Raises:
        InvalidInput: ``config`` is not a knob config for this workload, or the dtype is not one
            TVM runs the workload in.
        TuningError: the schedule template failed on this function (the message says where).
    """
    from tvm import te

    fam = family(workload)
    check_knobs(workload, config)
    workload.check_dtype(dtype, "tvm")
    func = te.create_prim_func(workload.tvm_compute(problem, dtype))
    try:
        sch = fam.schedule(func, config)
    except Exception as exc:
        raise TuningError(
            f"knob schedule {fam.summarize(config)!r} failed on {workload.name} {dict(problem)}:"
            f" {_short(exc)}"
        ) from exc
    mod: IRModule = sch.mod
    return mod


def summarize_knobs(config: Mapping[str, Any]) -> str:
    """``knobs i8 j32 k16 vec par u16`` (GEMM) or ``knobs r4 v16 par u16`` (rows)."""
    for fam in (GEMM, ROWS):
        if set(fam.params) <= set(config):
            try:
                return fam.summarize(config)
            except (KeyError, TypeError, ValueError):
                break
    return "knobs (unreadable config)"


def _short(exc: BaseException) -> str:
    """The useful part of a TVM error: its last non-empty lines, at most 2000 characters."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    text = "\n".join(lines[-4:]) if lines else type(exc).__name__
    return text[-_MAX_ERROR:]


__all__ = [
    "FAMILIES",
    "SCHEDULE_KNOBS",
    "KnobFamily",
    "apply_knobs",
    "check_knobs",
    "default_knobs",
    "family",
    "has_knobs",
    "knob_space",
    "summarize_knobs",
]
