"""A problem's parameters, checked: names that are identifiers, sizes in range, short flags;
and :func:`describe`, how any bad input is quoted in an error message.

A leaf: kernels, keys, configs and schemas all check problems and quote input this way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from tunecache.canonical import integral
from tunecache.errors import InvalidInput

# A dimension above this is not a kernel problem but a typo (2**31 elements per side).
MAX_DIM = 2**31 - 1
MAX_PARAMS = 32  # parameters of one problem
MAX_FLAG_CHARS = 64  # a string parameter (a layout, a mode)
# ASCII only, matched whole (``fullmatch``: ``$`` alone would let a trailing newline through).
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}")
ProblemValue = int | bool | str


def describe(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to about ``limit`` characters, for error messages about any input.

    ``repr`` escapes control characters and lone surrogates, so the message is always printable
    and encodable; a huge integer is described by its size (``str`` refuses over 4300 digits).
    """
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**limit:
        if value.bit_length() > 14_000:  # over 4214 digits: str() may refuse
            return f"an integer of {value.bit_length()} bits"
        digits = str(value)
        return f"{digits[:limit]}... ({len(digits.lstrip('-'))} digits)"
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value)} characters)" if isinstance(value, str) else ""
    return f"{text[:limit]}...{size}"


def check_sizes(problem: Any) -> dict[str, ProblemValue]:
    """Validates a problem's parameters: names are identifiers, sizes are integers in range.

    A value is an integer size in ``1..MAX_DIM``, a boolean flag, or a string of at most
    ``MAX_FLAG_CHARS`` characters; a problem has 1 to ``MAX_PARAMS`` parameters and at least one
    integer size. (:func:`tunecache.key.check_problem` checks a kernel's bucketed dimensions
    besides.)

    Raises:
        InvalidInput: naming the first bad parameter and the bound it breaks.
    """
    if not isinstance(problem, Mapping):
        raise InvalidInput(f"problem must be an object of NAME: size, not {type(problem).__name__}")
    if not problem:
        raise InvalidInput("problem: needs at least one parameter")
    if len(problem) > MAX_PARAMS:
        raise InvalidInput(f"problem has {len(problem)} parameters; the limit is {MAX_PARAMS}")
    checked: dict[str, ProblemValue] = {}
    for name, value in problem.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise InvalidInput(
                f"problem: parameter name {describe(name)} is not an identifier "
                "(ASCII letters, digits and _.:-, at most 128 characters)"
            )
        value = integral(value)  # 64.0 is the size 64 (JSON Schema's integer admits it)
        if isinstance(value, bool):
            checked[name] = value
        elif isinstance(value, int):
            if not 1 <= value <= MAX_DIM:
                raise InvalidInput(f"problem: {name}={describe(value)} is outside 1..{MAX_DIM}")
            checked[name] = value
        elif isinstance(value, str):
            if len(value) > MAX_FLAG_CHARS:
                raise InvalidInput(
                    f"problem: {name} is a string of {len(value)} characters; "
                    f"the limit is {MAX_FLAG_CHARS}"
                )
            checked[name] = value
        else:
            raise InvalidInput(
                f"problem: {name}={describe(value)} is not an integer size in 1..{MAX_DIM}, "
                "a boolean flag or a short string"
            )
    if not any(isinstance(v, int) and not isinstance(v, bool) for v in checked.values()):
        raise InvalidInput("problem: needs at least one integer size")
    return dict(sorted(checked.items()))


def foreign_params(known: Mapping[str, Any], problems: Sequence[Mapping[str, Any]]) -> str | None:
    """Why one of ``problems`` (a record's checks, in order) names a parameter ``known`` (the
    key's problem) does not have, or ``None``."""
    for i, problem in enumerate(problems):
        if extra := sorted(problem.keys() - known.keys()):
            return (f"validation.checks[{i}].problem names parameters the key's problem does not "
                    f"have: {', '.join(extra)}")  # fmt: skip
    return None
