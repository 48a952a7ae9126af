"""The base of every wire schema: strict models that refuse unknown fields and unsafe JSON.

:class:`Strict` models forbid unknown fields, are frozen, and refuse any body that
:func:`tunecache.jsonsafe.json_problem` finds unsafe (a NUL or lone surrogate, NaN, an integer
outside int64, deep nesting) — except data the server reads back from its own database
(:data:`STORED`). The schemas themselves are in :mod:`tunecache.schemas` and the modules it names.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, model_validator

from tunecache.canonical import integral
from tunecache.jsonsafe import json_problem

INTEGRAL = BeforeValidator(integral)  # 14.0 is the integer 14, as in JSON Schema
# A time of at least a nanosecond: no kernel launches faster, and ratios of times stay finite.
Millis = Annotated[float, Field(strict=True, ge=1e-6, lt=1e9, allow_inf_nan=False)]


# Validation context of data the server read back from its own database: it passed every check
# as it was written, and the walk for NULs and lone surrogates (a third of a lookup's query
# time) is not made again; every other constraint still is, and every client validates what it
# is served without this context.
STORED = {"stored": True}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _sane_json(cls, data: Any, info: ValidationInfo) -> Any:
        if info.context is STORED:
            return data
        if (why := json_problem(data, cls.__name__)) is not None:
            raise ValueError(why)
        return data
