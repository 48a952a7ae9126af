"""The cache key: everything whose change should invalidate a tuned config.

A :class:`Key` is a frozen value. Its :meth:`Key.digest` is the SHA-256 of its canonical JSON with a
schema version, so the client and the tuner agree on it across processes and machines.

Keys are built with :func:`key_for`, for the device the kernel runs on: a Triton kernel's key names
the GPU (never the host CPU), a TVM or Inductor kernel's the CPU unless told otherwise.

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

import itertools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tunecache.canonical import digest
from tunecache.device import Device, DeviceFingerprint, local_device
from tunecache.environment import environment_for
from tunecache.errors import InvalidInput
from tunecache.kernels import BACKENDS, as_spec, dtype_hint, nearest
from tunecache.policies import bucket_policy
from tunecache.problem import (
    MAX_DIM,
    NAME,
    ProblemValue,
    check_sizes,
    describe,
)
from tunecache.settings import interpret_enabled
from tunecache.strict import shown

KEY_SCHEMA_VERSION = 1
# Where each backend's kernels run unless a device is given (Triton under TRITON_INTERPRET=1
# runs on the CPU).
DEVICE_KINDS: dict[str, str] = {"triton": "cuda", "tvm": "cpu", "inductor": "cpu"}
DTYPES = (
    "float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2", "int8",
)  # fmt: skip


def kernel_module(kernel: str) -> str | None:
    """The module a user's kernel (``package.module:Class``) is imported from; ``None`` for a
    built-in kernel (a bare name)."""
    return kernel.partition(":")[0] if ":" in kernel else None


def arch_kind(arch: str) -> str:
    """``"cuda"`` for a GPU's arch (``sm_90``), else ``"cpu"``."""
    return "cuda" if arch.startswith("sm_") else "cpu"


def check_problem(problem: Any, *, kernel: str | None = None) -> dict[str, ProblemValue]:
    """Validates a problem's parameters (:func:`tunecache.problem.check_sizes`); given
    ``kernel``, the dimensions its lookup rules round to a bucket
    (:func:`tunecache.policies.bucket_policy`) must be integer sizes, not flags.

    Raises:
        InvalidInput: naming the first bad parameter and the bound it breaks.
    """
    checked = check_sizes(problem)
    if kernel is not None:
        for dim in bucket_policy(kernel).dims:
            value = checked.get(dim)
            if isinstance(value, bool | str):
                raise InvalidInput(
                    f"problem: {dim}={describe(value)} is not an integer size in 1..{MAX_DIM} "
                    f"({kernel}'s lookup rounds {dim} to a size bucket)"
                )
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
        if not isinstance(self.kernel, str) or not NAME.fullmatch(self.kernel):
            raise InvalidInput(f"kernel name {describe(self.kernel)} is not an identifier")
        if self.backend not in BACKENDS:
            raise InvalidInput(f"unknown backend {self.backend!r}{nearest(self.backend, BACKENDS)}"
                               f"; expected one of {BACKENDS}")  # fmt: skip
        if self.dtype not in DTYPES:
            raise InvalidInput(
                f"unknown dtype {self.dtype!r}; expected one of {DTYPES}"
                f"{dtype_hint(self.dtype, DTYPES)}"
            )
        # Store sorted plain dicts so equal keys compare equal whatever order they were built in.
        object.__setattr__(self, "problem", check_problem(self.problem, kernel=self.kernel))
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
            raise InvalidInput(
                f"key schema {describe(data.get('schema'))} is not {KEY_SCHEMA_VERSION}"
            )
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
        """SHA-256 of the key's canonical JSON: the identity the server stores winners under.

        Computed once per key (a key is immutable): a memo hit costs a dict lookup, not a hash.
        """
        found: str | None = self.__dict__.get("_digest")
        if found is None:
            found = digest(self.to_json())
            object.__setattr__(self, "_digest", found)
        return found

    def short(self) -> str:
        """A one-line human label: ``matmul[M=64,N=64,K=64] float32 tvm cpu-avx2``, the shape
        as :func:`problem_text` shows it."""
        return (f"{self.kernel}[{problem_text(self.problem)}] {self.dtype} {self.backend} "
                f"{self.device.arch}")  # fmt: skip


_DEVICE_NAME = re.compile(r"[a-z0-9.]+(?:-[a-z0-9.]+)*")


def device_text(name: str) -> str:
    """A device's name as shown: as it is where :func:`tunecache.device.normalise_name` could
    have made it (every client's key and verifier holds such a name), else quoted in ASCII as
    JSON writes it: an uploader's ``"NVIDIA \u041d100 80GB HBM3 "`` (a Cyrillic letter, a
    trailing space) read as the H100's own on the dashboard.

    >>> device_text("h100-80gb-hbm3"), device_text("NVIDIA H100 ")
    ('h100-80gb-hbm3', '"NVIDIA H100 "')
    """
    return name if _DEVICE_NAME.fullmatch(name) else json.dumps(name)


def problem_text(problem: Mapping[str, Any], sep: str = ",") -> str:
    """``M=64,N=64,K=64``: how a shape is shown everywhere (the CLI, logs, reports, the
    dashboard). A string is quoted as JSON writes it, in ASCII (``layout="bshd"``), so a size
    sent as text (``N="6144"``: another key, which no kernel takes as ``N=6144``) never reads as
    one, nor one holding the separator (``N="64,K=8"``) as two parameters, nor one spelt with
    a look-alike letter (a Cyrillic ``ѕ``: ``"b\u0455hd"``) as another; control characters and
    bidi controls are escaped (:func:`tunecache.strict.shown`: a key a server sent may hold
    them, and a log line it reaches is still one line no terminal acts on).

    Example:
        >>> problem_text({"M": 64, "N": "64", "causal": True})
        'M=64,N="64",causal=True'
    """
    return sep.join(shown(f"{name}={_value_text(value)}") for name, value in problem.items())


def _value_text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value)  # ASCII: no look-alikes


def source_labels(hashes: Iterable[str], least: int = 8) -> dict[str, str]:
    """Each source hash's shortest prefix, from ``least`` characters, that none of the others
    starts with: two versions of a kernel's code never read as one, even where an uploader chose
    a hash sharing the first eight characters of another's.

    >>> source_labels(["ab12cd34ef", "ab12cd34ff", "0123456789"])
    {'0123456789': '01234567', 'ab12cd34ef': 'ab12cd34e', 'ab12cd34ff': 'ab12cd34f'}
    """
    ordered = sorted(set(hashes))
    shared = [_common(a, b) for a, b in itertools.pairwise(ordered)]
    labels = {}
    for i, value in enumerate(ordered):  # neighbours in order share the longest prefixes
        nearest = max(shared[i - 1] if i > 0 else 0, shared[i] if i < len(shared) else 0)
        labels[value] = value[: max(least, nearest + 1)]
    return labels


class Versioned(Protocol):
    """What names a version of a kernel's code: a :class:`Key`'s or a ``KeyModel``'s parts."""

    @property
    def kernel(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def source_hash(self) -> str: ...


def kernel_names(keys: Sequence[Versioned]) -> list[str]:
    """Each key's kernel, as a listing of ``keys`` shows it: with its source where the listing
    holds another version of that kernel's code (another source hash). Two such keys read alike,
    and neither is served for the other's code.

    >>> from types import SimpleNamespace as Named
    >>> a, b = (Named(kernel="k", backend="tvm", source_hash=h) for h in ("ab12", "ff00"))
    >>> kernel_names([a, b, a])
    ['k (source ab12)', 'k (source ff00)', 'k (source ab12)']
    """
    sources: dict[tuple[str, str], set[str]] = {}
    for key in keys:
        sources.setdefault((key.kernel, key.backend), set()).add(key.source_hash)
    labels = {named: source_labels(hashes) for named, hashes in sources.items() if len(hashes) > 1}
    names = []
    for key in keys:
        label = labels.get((key.kernel, key.backend), {}).get(key.source_hash)
        names.append(key.kernel if label is None else f"{key.kernel} (source {label})")
    return names


def _common(a: str, b: str) -> int:
    """How many characters ``a`` and ``b`` start with alike."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def device_kind(backend: str) -> str:
    """``"cuda"`` or ``"cpu"``: where ``backend``'s kernels run here by default."""
    if backend not in DEVICE_KINDS:
        raise InvalidInput(f"unknown backend {backend!r}{nearest(backend, BACKENDS)}; expected "
                           f"one of {BACKENDS}")  # fmt: skip
    if backend == "triton":
        try:
            return "cpu" if interpret_enabled() else "cuda"
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
    return DEVICE_KINDS[backend]


def key_for(
    kernel: Any,
    backend: str,
    problem: Mapping[str, Any],
    dtype: str,
    device: Device | DeviceFingerprint | str | None = None,
) -> Key:
    """The cache key of ``kernel`` (a :class:`~tunecache.kernels.KernelSpec`, a workload, a
    built-in name or ``"package.module:qualname"``) on ``backend`` at ``problem`` in ``dtype``.

    Args:
        device: the device the kernel runs on; by default this machine's device of the kind the
            backend runs on (:func:`device_kind`: CUDA device 0 for Triton); ``"cpu"`` or
            ``"cuda"`` names a kind (Inductor or TVM with a CUDA target).

    Raises:
        InvalidInput: unknown kernel, backend or dtype, a malformed problem, or a CUDA key
            asked for on a machine without a visible CUDA device and no ``device`` given.

    Example:
        >>> key = key_for("matmul", "tvm", {"M": 64, "N": 64, "K": 64}, "float32")
        >>> key.device.kind
        'cpu'
    """
    spec = as_spec(kernel)
    spec.check_dtype(dtype, backend)
    if device is None or isinstance(device, str):
        device = local_device(device or device_kind(backend))
    fingerprint = device.fingerprint if isinstance(device, Device) else device
    return Key(
        kernel=spec.name,
        source_hash=spec.source_hash(backend),
        backend=backend,
        problem=spec.problem(problem),
        dtype=dtype,
        device=fingerprint,
        environment=environment_for(backend),
    )
