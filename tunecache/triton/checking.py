"""A Triton config's check, run: the config and the reference on identical fresh copies of a
call's arguments, each launched as the caller's first launch would be, and the outputs compared.

Which arguments are outputs: the ones named by ``outputs=`` (a kernel that also writes a scratch
buffer whose layout depends on the config, flash-decoding's partials say, names its real
outputs), else every tensor argument. A check that cannot tell a right config from a wrong one
here raises :class:`~tunecache.errors.CheckUnavailable`: the copies, the reference or the
comparison failing, the device short of memory, or the reference's own output holding NaN or
inf on the copies (an input the caller keeps positive, drawn negative, say): both sides NaN is
no evidence against the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from triton import Config

from tunecache.errors import CheckUnavailable, one_line
from tunecache.key import Key
from tunecache.schemas import CheckModel
from tunecache.triton.check import SEED, compare_outputs, finish, fresh_call, out_of_memory
from tunecache.triton.launching import full_arguments, launch, reset_for_reference

Call = tuple[list[Any], dict[str, Any]]


def run_check(tuner: Any, config: Config, first: Config, args: tuple[Any, ...],
              kwargs: dict[str, Any], tolerance: float, key: Key) -> CheckModel:  # fmt: skip
    """``config``'s outputs against ``tuner.reference`` (else ``first``'s) on identical fresh
    copies of the call's arguments (drawn again keeping non-negative inputs so where the
    reference's output was not finite: :mod:`tunecache.triton.check`). Only ``config``'s own
    launch failing (not for memory) raises something other than :class:`CheckUnavailable`."""
    got, expected = _reference(tuner, first, args, kwargs, keep_sign=False)
    if _not_finite(expected) is not None:
        del got, expected  # the second draw's copies in their place, not beside them
        got, expected = _reference(tuner, first, args, kwargs, keep_sign=True)
    if not any(is_tensor(value) for value in expected.values()):  # a check comparing nothing
        raise CheckUnavailable(f"outputs={getattr(tuner, 'outputs', None)!r} names no tensor "
                               "of this call: nothing to compare")  # fmt: skip
    if (where := _not_finite(expected)) is not None:
        raise CheckUnavailable(f"the reference's own output {where!r} has NaN or inf on the "
                               "check's random inputs")  # fmt: skip
    try:
        launch(tuner, config, *got)
        finish(got)
    except Exception as exc:
        if out_of_memory(exc):
            raise CheckUnavailable(f"the config's run: {one_line(exc)}") from exc
        raise
    try:
        return compare_outputs(list(outputs_of(tuner, got).values()),
                               list(expected.values()), tolerance, key.problem)  # fmt: skip
    except Exception as exc:
        raise CheckUnavailable(f"the comparison: {one_line(exc)}") from exc


def _reference(tuner: Any, first: Config, args: tuple[Any, ...], kwargs: dict[str, Any], *,
               keep_sign: bool) -> tuple[Call, dict[str, Any]]:  # fmt: skip
    """The config's fresh copies, and the reference's outputs on identical ones."""
    try:
        got = fresh_call(args, kwargs, SEED, keep_sign=keep_sign)
        want = fresh_call(args, kwargs, SEED, keep_sign=keep_sign)
        if tuner.reference is not None:
            reset_for_reference(tuner, *want)
            named = {k: v for k, v in want[1].items() if k in tuner.arg_names}
            tuner.reference(*want[0], **named)
        else:
            launch(tuner, first, *want)
        finish(want)  # a device's error surfaces here, not in the config's run
    except Exception as exc:
        raise CheckUnavailable(f"the reference's run: {one_line(exc)}") from exc
    return got, outputs_of(tuner, want)


def outputs_of(tuner: Any, call: Call) -> dict[str, Any]:
    """What a check compares of ``call``, by name: the arguments ``tuner.outputs`` names, in
    that order, else every argument (tensors compared, the rest skipped)."""
    named = full_arguments(tuner.arg_names, None, *call)
    names = getattr(tuner, "outputs", None)
    if names is None:
        return named
    return {name: named[name] for name in names if name in named}


def is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _not_finite(outputs: Mapping[str, Any]) -> str | None:
    """The name of the first of ``outputs`` holding NaN or inf, or ``None``."""
    import torch

    for name, value in outputs.items():
        floating = isinstance(value, torch.Tensor) and value.is_floating_point()
        if floating and value.numel() and not bool(torch.isfinite(value).all()):
            return name
    return None
