"""A key on the wire (:class:`KeyModel`): its device, its problem and the names it holds.

Every field is bounded and strict as in :mod:`tunecache.schemas` (which re-exports these), and a
problem is checked by :func:`tunecache.key.check_problem` with the kernel's own rules.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StrictBool, ValidationInfo, field_validator

from tunecache import examples
from tunecache.canonical import integral
from tunecache.errors import InvalidInput
from tunecache.key import BACKENDS, DTYPES, KEY_SCHEMA_VERSION, Key, check_problem
from tunecache.problem import MAX_DIM, MAX_FLAG_CHARS, MAX_PARAMS, describe
from tunecache.strict import INTEGRAL, Line
from tunecache.strict import Strict as _Strict

Backend = Literal["triton", "tvm", "inductor"]
assert set(BACKENDS) == {"triton", "tvm", "inductor"}
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_.:-]*$")]
SourceHash = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[0-9a-f]+$")]

# The constraints of ``tunecache.key.check_problem`` that JSON Schema can say (the document a
# client is generated from); it also checks that one size is an integer, and the kernel's rules.
ProblemName = Annotated[str, Field(min_length=1, max_length=128,
                                   pattern=r"^[A-Za-z_][A-Za-z0-9_.:-]*$")]  # fmt: skip
ProblemValue = (
    Annotated[int, Field(strict=True, ge=1, le=MAX_DIM), INTEGRAL]
    | StrictBool
    | Annotated[Line, Field(strict=True, max_length=MAX_FLAG_CHARS)]  # printable: logs show it
)
Problem = Annotated[
    dict[ProblemName, ProblemValue],
    Field(min_length=1, max_length=MAX_PARAMS, json_schema_extra={"additionalProperties": False}),
]
# A string (a list is "not a valid string"), one of DTYPES (checked by KeyModel, naming them).
Dtype = Annotated[str, Field(json_schema_extra={"enum": list(DTYPES)})]


class DeviceModel(_Strict):
    kind: Literal["cpu", "cuda", "rocm"]
    arch: Name
    name: Annotated[Line, Field(min_length=1, max_length=128)]
    units: Annotated[int, Field(strict=True, ge=1, le=1_000_000), INTEGRAL]
    memory_gb: Annotated[int, Field(strict=True, ge=0, le=1_000_000), INTEGRAL] = 0
    flags: Annotated[list[Name], Field(max_length=64)] = []


def checked_problem(value: Any, kernel: str | None = None) -> Any:
    """``check_problem`` as a pydantic validator: one error naming the parameter and its bound."""
    try:
        return check_problem(value, kernel=kernel)
    except InvalidInput as exc:
        raise ValueError(str(exc)) from None


class KeyModel(_Strict):
    """A :class:`tunecache.key.Key` on the wire."""

    schema_: Annotated[
        int, Field(alias="schema", json_schema_extra={"const": KEY_SCHEMA_VERSION})
    ] = KEY_SCHEMA_VERSION
    kernel: Name
    source_hash: SourceHash
    backend: Backend
    problem: Problem
    dtype: Dtype
    device: DeviceModel
    # Distribution name -> version (tunecache.environment).
    environment: Annotated[
        dict[
            Annotated[
                str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
            ],
            Annotated[Line, Field(max_length=64)],
        ],
        Field(max_length=16, json_schema_extra={"additionalProperties": False}),
    ]

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True,
                              json_schema_extra={"examples": [examples.KEY]})  # fmt: skip

    @field_validator("schema_", mode="before")
    @classmethod
    def _known_schema(cls, value: Any) -> Any:
        if type(integral(value)) is not int or value != KEY_SCHEMA_VERSION:  # not True
            raise ValueError(f"key schema {describe(value)} is not {KEY_SCHEMA_VERSION}")
        return KEY_SCHEMA_VERSION

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value not in DTYPES:
            raise ValueError(f"unknown dtype {describe(value)}; expected one of {DTYPES}")
        return value

    @field_validator("problem", mode="before")
    @classmethod
    def _valid_problem(cls, value: Any, info: ValidationInfo) -> Any:
        return checked_problem(value, info.data.get("kernel"))

    @classmethod
    def from_key(cls, key: Key) -> KeyModel:
        return cls.model_validate(key.to_json())

    def to_key(self) -> Key:
        return Key.from_json(self.model_dump(by_alias=True))

    def digest(self) -> str:
        return self.to_key().digest()
