"""Closed schemas: what a served config or artifact may hold, per backend. Data, never code.

A record served to thousands of processes must not be able to run code in them or change their
results, whoever uploaded it and whatever sits between the server and the client. So a config is
checked against a closed schema of its backend — by the server when it is uploaded (a 422 naming
the field) and again by the client before it is used (the client trusts no server):

- **Triton** (:mod:`tunecache.configcheck.triton`): numeric meta-parameters, launch options in
  range; a built-in kernel's config must be in its enumerated choices;
- **TVM** (:mod:`tunecache.configcheck.tvm`, the trace allowlist in
  :mod:`tunecache.configcheck.tvm_trace`): the default schedule, a knob config, or a
  MetaSchedule trace of allowlisted instructions and annotations (nothing that links code, such
  as ``pragma_import_llvm``);
- **Inductor** (:mod:`tunecache.configcheck.inductor`): settings Inductor offers (its mode, its
  own GEMM backends), choice timings and best configs of the shape Inductor writes;
- **serving engines' imported configs** (:func:`tunecache.vllm_moe.imported_value_problem`):
  a fused-MoE entry's six whole numbers, and the file and origin it came from.

Nothing here imports TVM, torch or Triton: the server runs these checks too.

Example:
    >>> config_problem("triton", {"BLOCK": 64, "num_warps": "4"})
    "num_warps='4' is not an integer"
    >>> config_problem("tvm", {"schedule": "default"}) is None
    True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tunecache.configcheck import inductor, triton, tvm
from tunecache.errors import InvalidInput
from tunecache.kernels import registered
from tunecache.problem import describe
from tunecache.vllm_moe import imported_value_problem

_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "triton": triton.config_problem,
    "tvm": tvm.config_problem,
    "inductor": inductor.config_problem,
}
_ARTIFACT_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "tvm.record": tvm.record_value_problem,
    "tvm.workload": tvm.workload_value_problem,
    "inductor.choices": inductor.choice_group_problem,
    "inductor.autotune": inductor.best_config_problem,
    "vllm.moe": imported_value_problem,
}


def config_problem(
    backend: str, config: Any, *, kernel: str | None = None, device: str = "cpu"
) -> str | None:
    """Why ``config`` may not be served for ``backend`` (and ``kernel``) to run on a ``device``
    of that kind (``cpu``, ``cuda``), or ``None``.

    The reason names the field within the config. A kernel registered in this process with
    enumerated choices for the backend (the built-in kernels' Triton spaces) takes only configs
    inside them.
    """
    if backend == "tvm":
        why = tvm.config_problem(config, device)
    elif (check := _CHECKS.get(backend)) is not None:
        why = check(config)
    else:
        return f"backend {describe(backend)} has no config schema"
    if why is not None:
        return why
    spec = registered(kernel) if kernel is not None else None
    if spec is not None and backend in spec.choices:
        why = space_problem(config, spec.choices[backend], spec.config_defaults.get(backend, {}))
        if why is not None:
            return f"{why} ({kernel}'s {backend} space)"
    return None


def completed(backend: str, config: Any, *, kernel: str | None = None) -> Any:
    """``config`` with the parameters its kernel's ``backend`` space lets it leave out set to
    their defaults (a kernel registered in this process; else ``config`` as it is): the config
    that runs, whichever way it was written, so that two records of it compare equal.

    Example:
        >>> completed("triton", {"BLOCK_M": 64}, kernel="matmul")
        {'SPLIT_K': 1, 'BLOCK_M': 64}
    """
    spec = registered(kernel) if kernel is not None else None
    defaults = {} if spec is None else spec.config_defaults.get(backend, {})
    if not defaults or not isinstance(config, Mapping):
        return config
    return {**{k: v for k, v in defaults.items() if k not in config}, **config}


def as_run(backend: str, config: Any, *, kernel: str | None = None) -> str | None:
    """:func:`completed` ``config`` in canonical JSON (types kept: ``True`` is not ``1``): equal
    for two configs that run the same; ``None`` for one that is not plain JSON data."""
    from tunecache.canonical import canonical_json

    try:
        return canonical_json(completed(backend, config, kernel=kernel))
    except InvalidInput:
        return None


def space_problem(config: Mapping[str, Any], choices: Mapping[str, tuple[Any, ...]],
                  defaults: Mapping[str, Any]) -> str | None:  # fmt: skip
    """Why ``config`` is outside ``choices`` (parameter → its values; a parameter of
    ``defaults`` may be left out), or ``None``."""
    extra = sorted(set(config) - set(choices))
    if extra:
        return f"{extra[0]} is not a parameter of the space ({', '.join(choices)})"
    for name, values in choices.items():
        if name not in config:
            if name in defaults:
                continue
            return f"{name} is missing"
        value = config[name]
        # A flag is not a size and 4.0 is no warp count: compare types too.
        if not any(type(value) is type(v) and value == v for v in values):
            return f"{name}={describe(value, 20)} is not one of {values}"
    return None


def artifact_problem(namespace: str, value: Any) -> str | None:
    """Why ``value`` may not be stored or served in artifact ``namespace``, or ``None``."""
    check = _ARTIFACT_CHECKS.get(namespace)
    if check is None:
        return f"namespace {describe(namespace)} has no value schema"
    return check(value)


__all__ = ["artifact_problem", "config_problem", "space_problem"]
