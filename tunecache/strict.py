"""The base of every wire schema: strict models that refuse unknown fields and unsafe JSON.

:class:`Strict` models forbid unknown fields, are frozen, and refuse any body that
:func:`tunecache.jsonsafe.json_problem` finds unsafe (a NUL or lone surrogate, NaN, an integer
outside int64, deep nesting) — except data the server reads back from its own database
(:data:`STORED`). The schemas themselves are in :mod:`tunecache.schemas` and the modules it names.

Free text that is later printed or rendered (a config's summary, a device's name, a note, an
error) is a :data:`Line` (one line of printable text) or a :data:`Text` (lines: a newline and a
tab allowed): either refuses a control character (C0, DEL, C1) and a Unicode bidi control, which
would let an uploader forge or hide what a terminal shows beside it. What a server reads back
from its own database (:data:`STORED`) and what a client reads from a server (:data:`SERVED`) is
read as it is: every display escapes it (:func:`shown`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from datetime import UTC, datetime
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationInfo,
    model_validator,
)

from tunecache.canonical import integral
from tunecache.jsonsafe import json_problem, storable_text

INTEGRAL = BeforeValidator(integral)  # 14.0 is the integer 14, as in JSON Schema
# -0.0 is 0 (it passes ge=0, and a record read "max rel error -0.00e+00", "tuned in -0.0 s")
UNSIGNED = AfterValidator(lambda value: value + 0.0)
# A time of at least a nanosecond: no kernel launches faster, and ratios of times stay finite.
Millis = Annotated[float, Field(strict=True, ge=1e-6, lt=1e9, allow_inf_nan=False)]


def in_utc(value: datetime) -> datetime:
    """``value`` in UTC, as every timestamp the API stores and sends (one without a zone read as
    UTC): a date stated in another zone was stored and served in it (``+23:59``) and a client
    showed it labelled UTC; one before year 1 in UTC (``0001-01-01T00:00:00+01:00``) failed the
    import's write with a 500."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{value.isoformat()} is out of range in UTC (years 1 to 9999)") from None


Utc = Annotated[datetime, AfterValidator(in_utc)]  # a time the API sends, read back in UTC

# Validation context of data the server read back from its own database: it passed every check
# as it was written, and the walk for NULs and lone surrogates (a third of a lookup's query
# time) is not made again; every other constraint still is, and every client validates what it
# is served without this context.
STORED = {"stored": True}
# Validation context of a server's answer as a client reads it: still checked for unsafe JSON,
# but its free text is taken as it is (a record stored before the checks below existed stays
# readable) and escaped wherever it is shown.
SERVED = {"served": True}

# What a terminal or a page would act on rather than show: C0 controls, DEL, C1 controls (ESC's
# 8-bit forms among them), the marks and overrides that reorder text (bidi), line and paragraph
# separators, interlinear annotations, and every character Unicode says shows as nothing
# (Default_Ignorable_Code_Point: soft hyphen, zero-width spaces and joiners, the combining
# grapheme joiner, variation selectors, Hangul fillers, the byte-order mark, tags...: "ci",
# "c\u200bi" and "ci\u3164" looked one uploader). A Text may hold a newline and a tab.
_BIDI = r"\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_INVISIBLE = (
    r"\u00ad\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200d\u2028\u2029"
    r"\u2060-\u2065\u206a-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb"
)
_NOT_IN_LINE = r"\x00-\x1f\x7f-\x9f" + _BIDI + _INVISIBLE  # as a regex (Python's, JSON Schema's)
_NOT_IN_TEXT = r"\x00-\x08\x0b-\x1f\x7f-\x9f" + _BIDI + _INVISIBLE
# Invisible too, past the BMP (so not in the JSON Schema's pattern): shorthand format controls,
# musical formatting, tags and the variation selectors' supplement.
_ASTRAL = "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff"
UNSHOWN = re.compile(f"[{_NOT_IN_LINE}{_ASTRAL}]")
_NOT_TEXT = re.compile(f"[{_NOT_IN_TEXT}{_ASTRAL}]")


def _checked(value: str, info: ValidationInfo, refused: re.Pattern[str], what: str) -> str:
    if info.context is STORED or info.context is SERVED:
        return value
    if (found := refused.search(value)) is not None:
        raise ValueError(f"holds the control character U+{ord(found.group()):04X} at "
                         f"{found.start()}: {what}")  # fmt: skip
    return value


def _one_line(value: str, info: ValidationInfo) -> str:
    return _checked(value, info, UNSHOWN, "expected one line of printable text")


def _lines(value: str, info: ValidationInfo) -> str:
    return _checked(value, info, _NOT_TEXT, "expected printable text (newlines, tabs allowed)")


# One line of printable text (give it a length: Annotated[Line, Field(max_length=64)]).
Line = Annotated[str, AfterValidator(_one_line),
                 Field(json_schema_extra={"pattern": f"^[^{_NOT_IN_LINE}]*$"})]  # fmt: skip
# Printable text of one or more lines: an error message, a compiler's excerpt.
Text = Annotated[str, AfterValidator(_lines),
                 Field(json_schema_extra={"pattern": f"^[^{_NOT_IN_TEXT}]*$"})]  # fmt: skip


def shown(text: str) -> str:
    """``text`` as one line a terminal shows as it is: each control character (a newline too)
    and bidi control escaped as Python writes it.

    Example:
        >>> shown("tile 4x8\\n  trust \\x1b[8m")
        'tile 4x8\\\\n  trust \\\\x1b[8m'
    """
    if UNSHOWN.search(text) is None:
        return text
    return UNSHOWN.sub(lambda m: _escaped(m.group()), text)


def _escaped(char: str) -> str:
    """``char`` as Python writes it escaped (``\\x1b``, ``\\u200b``), even where ``repr`` would
    write it as it is (a Hangul filler is printable to Python, and shows as nothing)."""
    code = ord(char)
    if code < 0x100:
        return repr(char)[1:-1]
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


# Set while a model's fields are validated after its whole body was walked: the models nested
# in it are part of that body, and walking each again made a 2 MiB answer of nested models
# take seconds (each level walked the levels below it once more).
_WALKED: ContextVar[bool] = ContextVar("tunecache_json_walked", default=False)


class Strict(BaseModel):
    """Refuses unknown fields in what it checks (a request, an upload, a file written here);
    in a server's answer (:data:`SERVED`) an unknown field is left out instead: a newer server
    adds fields to its answers, and a client that refused them turned every hit into its
    default config (and an upload the server stored into an exception)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="wrap")
    @classmethod
    def _sane_json(cls, data: Any, handler: ModelWrapValidatorHandler[Any],
                   info: ValidationInfo) -> Any:  # fmt: skip
        if info.context is SERVED and isinstance(data, dict):
            known = _known_fields(cls)
            if not known.issuperset(data):
                data = {name: value for name, value in data.items() if name in known}
        if info.context is STORED or _WALKED.get():
            return handler(data)
        why = json_problem(data, cls.__name__)
        if why is not None and info.context is SERVED:
            # A newer server's field this client does not know, deeper down (a 64-bit counter
            # past int64), is left out before it is held against the answer.
            data = _pruned(cls, data)
            why = json_problem(data, cls.__name__)
        if why is not None:
            raise ValueError(why)
        walked = _WALKED.set(True)
        try:
            return handler(data)
        finally:
            _WALKED.reset(walked)


def printable_text(text: str, limit: int) -> str:
    """``text`` from outside (an exception's, a compiler's message) as a :data:`Text` holds it,
    cut to ``limit`` characters: what :func:`tunecache.jsonsafe.storable_text` makes of it, a
    line ending ``\\r\\n`` a newline, and any other control character U+FFFD.

    Example:
        >>> printable_text("red\\x1b[31m\\r\\nline", 40)
        'red\ufffd[31m\\nline'
    """
    return _NOT_TEXT.sub("\ufffd", storable_text(text.replace("\r\n", "\n"), limit))[:limit]


@functools.cache
def _known_fields(model: type[BaseModel]) -> frozenset[str]:
    """The names a model's fields may be given by in JSON: their names and aliases."""
    return frozenset(_field_types(model))


@functools.cache
def _field_types(model: type[BaseModel]) -> dict[str, Any]:
    """Each field's type by every name it may be given in JSON."""
    types: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        for known in (name, field.alias, field.validation_alias):
            if isinstance(known, str):
                types[known] = field.annotation
    return types


def _pruned(model: type[BaseModel], data: Any) -> Any:
    """``data`` as ``model`` reads it, less the fields no model in it knows, at every depth."""
    if not isinstance(data, dict):
        return data
    types = _field_types(model)
    return {name: _pruned_as(types[name], value) for name, value in data.items() if name in types}


def _pruned_as(kind: Any, value: Any) -> Any:
    """``value`` as a field of type ``kind`` holds it, pruned where a model is in ``kind``."""
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return _pruned(kind, value)
    origin, args = get_origin(kind), get_args(kind)
    if origin is Annotated:
        return _pruned_as(args[0], value)
    if origin in (list, tuple, Sequence) and isinstance(value, list) and args:
        return [_pruned_as(args[0], item) for item in value]
    if origin in (dict, Mapping) and isinstance(value, dict) and len(args) == 2:
        return {key: _pruned_as(args[1], item) for key, item in value.items()}
    if origin in (Union, UnionType):
        others = [arg for arg in args if arg is not type(None)]
        return _pruned_as(others[0], value) if len(others) == 1 else value
    return value
