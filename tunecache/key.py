"""The cache key: everything whose change should invalidate a tuned config.

A :class:`Key` is a frozen value. Its :meth:`Key.digest` is the SHA-256 of its canonical JSON with a
schema version, so the client and the tuner agree on it across processes and machines.

Example:
    >>> from tunecache.device import DeviceFingerprint
    >>> cpu = DeviceFingerprint(kind="cpu", arch="cpu-avx2", name="xeon", units=2)
    >>> key = Key(kernel="matmul", source_hash="ab12", backend="tvm",
    ...           problem={"M": 64, "N": 64, "K": 64}, dtype="float32", device=cpu,
    ...           environment={"apache-tvm": "0.27.0.post1"})
    >>> len(key.digest())
    64
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tunecache.canonical import digest
from tunecache.device import DeviceFingerprint
from tunecache.errors import InvalidInput

KEY_SCHEMA_VERSION = 1
BACKENDS = ("triton", "tvm", "inductor")
DTYPES = (
    "float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2", "int8",
)  # fmt: skip
# A dimension above this is not a kernel problem but a typo (2**31 elements per side).
MAX_DIM = 2**31 - 1
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$")
ProblemValue = int | bool | str


def check_problem(problem: Mapping[str, Any]) -> dict[str, ProblemValue]:
    """Validates a problem's parameters: names are identifiers, sizes are integers in range.

    Raises:
        InvalidInput: naming the first bad parameter.
    """
    if not problem:
        raise InvalidInput("problem: needs at least one parameter")
    checked: dict[str, ProblemValue] = {}
    for name, value in problem.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidInput(f"problem: parameter name {name!r} is not an identifier")
        if isinstance(value, bool) or (isinstance(value, str) and len(value) <= 64):
            checked[name] = value
        elif isinstance(value, int):
            if not 1 <= value <= MAX_DIM:
                raise InvalidInput(f"problem: {name}={value} is outside 1..{MAX_DIM}")
            checked[name] = value
        else:
            raise InvalidInput(f"problem: {name}={value!r} is not an integer size or a flag")
    return dict(sorted(checked.items()))


@dataclass(frozen=True)
class Key:
    """One tuning problem: kernel, backend, problem shape, dtype, device, software versions."""

    kernel: str
    source_hash: str
    backend: str
    problem: Mapping[str, ProblemValue]
    dtype: str
    device: DeviceFingerprint
    environment: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _NAME.match(self.kernel):
            raise InvalidInput(f"kernel name {self.kernel!r} is not an identifier")
        if self.backend not in BACKENDS:
            raise InvalidInput(f"unknown backend {self.backend!r}; expected one of {BACKENDS}")
        if self.dtype not in DTYPES:
            raise InvalidInput(f"unknown dtype {self.dtype!r}; expected one of {DTYPES}")
        # Store sorted plain dicts so equal keys compare equal whatever order they were built in.
        object.__setattr__(self, "problem", check_problem(self.problem))
        object.__setattr__(self, "environment", dict(sorted(self.environment.items())))

    def __hash__(self) -> int:
        return hash(self.digest())

    def to_json(self) -> dict[str, Any]:
        """The key as JSON data (the form that is hashed and sent on the wire)."""
        return {
            "schema": KEY_SCHEMA_VERSION,
            "kernel": self.kernel,
            "source_hash": self.source_hash,
            "backend": self.backend,
            "problem": dict(self.problem),
            "dtype": self.dtype,
            "device": self.device.to_json(),
            "environment": dict(self.environment),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Key:
        """Builds a key from :meth:`to_json`'s output.

        Raises:
            InvalidInput: a field is missing or of the wrong schema version.
        """
        if data.get("schema", KEY_SCHEMA_VERSION) != KEY_SCHEMA_VERSION:
            raise InvalidInput(f"key schema {data.get('schema')!r} is not {KEY_SCHEMA_VERSION}")
        try:
            return cls(
                kernel=data["kernel"],
                source_hash=data["source_hash"],
                backend=data["backend"],
                problem=data["problem"],
                dtype=data["dtype"],
                device=DeviceFingerprint.from_json(data["device"]),
                environment=data.get("environment", {}),
            )
        except KeyError as exc:
            raise InvalidInput(f"key: missing field {exc.args[0]!r}") from None

    def digest(self) -> str:
        """SHA-256 of the key's canonical JSON: the identity the server stores winners under."""
        return digest(self.to_json())

    def short(self) -> str:
        """A one-line human label: ``matmul[M=64,N=64,K=64] float32 tvm cpu-avx2``."""
        shape = ",".join(f"{k}={v}" for k, v in self.problem.items())
        return f"{self.kernel}[{shape}] {self.dtype} {self.backend} {self.device.arch}"
