"""The fastest backend for a kernel × problem × dtype × device, with the others' times beside it.

Each backend has its own key (its own source hash and environment), so :func:`best_backend` builds
one key per backend the kernel supports in the dtype, resolves each through a
:class:`~tunecache.resolver.Resolver` (validated records only; no default config counts) and ranks
the answers by their records' median times. torch eager is a contender too: every record was
timed against it in alternating rounds, and where the fastest record's comparison found eager
measurably faster, :attr:`BestBackend.eager_faster` says so.

Times are comparable only when they were measured on one device: a record served by the
``same_arch`` rule was timed on another device of the arch, and a GPU backend's record on another
kind of device than a CPU backend's. :class:`BestBackend` says whether they were, and why not.

Example:
    >>> answer = best_backend(resolver, "matmul", {"M": 64, "N": 64, "K": 64}, "float32")
    ... # doctest: +SKIP
    >>> answer.backend, answer.comparable  # doctest: +SKIP
    ('inductor', True)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tunecache.canonical import canonical_json
from tunecache.errors import InvalidInput
from tunecache.kernels import BACKENDS, as_spec
from tunecache.key import Key, key_for

if TYPE_CHECKING:
    from tunecache.device import Device, DeviceFingerprint
    from tunecache.lookup import LookupResult


class Resolves(Protocol):
    """What ranking needs of a resolver (:class:`tunecache.resolver.Resolver`): one lookup."""

    def resolve(self, key: Key, *, default: dict[str, Any] | None = None) -> LookupResult: ...


@dataclass(frozen=True)
class BackendAnswer:
    """One backend's answer: its key, the lookup result on a hit, or why it has none."""

    backend: str
    key: Key | None
    result: LookupResult | None
    why_not: str | None = None

    @property
    def time_ms(self) -> float | None:
        """The served record's median time, or ``None`` on a miss."""
        return None if self.result is None else self.result.time_ms

    @property
    def device(self) -> str | None:
        """The device the served record was timed on (``arch name``), or ``None`` on a miss."""
        return None if self.result is None else self.result.device


@dataclass(frozen=True)
class BestBackend:
    """Every backend's answer, fastest first (misses last), and whether the times compare."""

    answers: tuple[BackendAnswer, ...]
    comparable: bool
    note: str

    @property
    def winner(self) -> BackendAnswer | None:
        """The fastest backend's answer, or ``None`` when no backend has a validated record."""
        first = self.answers[0] if self.answers else None
        return first if first is not None and first.time_ms is not None else None

    @property
    def backend(self) -> str | None:
        return None if self.winner is None else self.winner.backend

    @property
    def eager_ms(self) -> float | None:
        """torch eager's time, from the fastest record's own comparison (timed in alternating
        rounds with it: the framework's op is a contender too)."""
        return None if self.winner is None or self.winner.result is None \
            else self.winner.result.eager_ms  # fmt: skip

    @property
    def eager_faster(self) -> bool:
        """Whether torch eager ran measurably faster than the fastest tuned record (the whole
        interval of their comparison): then not tuning is the best answer."""
        return self.winner is not None and self.winner.result is not None \
            and self.winner.result.slower_than_eager  # fmt: skip


def best_backend(
    resolver: Resolves,
    kernel: Any,
    problem: Mapping[str, Any],
    dtype: str,
    device: Device | DeviceFingerprint | str | None = None,
    *,
    backends: Sequence[str] | None = None,
) -> BestBackend:
    """Resolves ``kernel`` at ``problem`` in ``dtype`` on each backend and ranks the hits.

    Args:
        device: as in :func:`~tunecache.key.key_for`: by default each backend's own device here
            (a Triton key needs a visible GPU, or ``TRITON_INTERPRET=1``).
        backends: the backends to ask; by default every backend the kernel has in ``dtype``.

    Raises:
        InvalidInput: an unknown kernel or backend, a malformed problem, or a dtype no asked
            backend supports.
    """
    spec = as_spec(kernel)
    unknown = [b for b in backends or () if b not in BACKENDS]
    if unknown:
        raise InvalidInput(f"unknown backend {unknown[0]!r}; backends: {', '.join(BACKENDS)}")
    asked = list(backends or BACKENDS)
    supported = [b for b in asked if dtype in spec.dtypes.get(b, ())]
    if not supported:
        raise InvalidInput(
            f"{spec.name} has no backend for {dtype} among {', '.join(asked)}; "
            + "; ".join(f"{b}: {', '.join(d)}" for b, d in spec.dtypes.items() if d)
        )
    spec.problem(problem)  # a malformed problem is wrong for every backend: say so once
    answers = [_ask(resolver, spec, b, problem, dtype, device) for b in supported]
    answers.sort(key=lambda a: (a.time_ms is None, a.time_ms or 0.0, a.backend))
    comparable, note = _comparability(answers)
    return BestBackend(tuple(answers), comparable, note)


def _ask(
    resolver: Resolves, spec: Any, backend: str, problem: Mapping[str, Any], dtype: str,
    device: Any,
) -> BackendAnswer:  # fmt: skip
    try:
        key = key_for(spec, backend, problem, dtype, device)
    except InvalidInput as exc:  # no device for this backend here (a GPU for Triton)
        return BackendAnswer(backend, None, None, str(exc))
    result = resolver.resolve(key, default=None)
    if not result.hit:
        return BackendAnswer(backend, key, None, "no validated record")
    if result.time_ms is None:
        return BackendAnswer(backend, key, None, "the record's time is unknown")
    return BackendAnswer(backend, key, result)


def _comparability(answers: Sequence[BackendAnswer]) -> tuple[bool, str]:
    hits = [a for a in answers if a.result is not None]
    if not hits:
        return True, "no backend has a validated record"
    if len({a.device for a in hits}) > 1:
        where = "; ".join(f"{a.backend} on {a.device}" for a in hits)
        return False, f"times measured on different devices are not comparable ({where})"
    problems = {canonical_json(a.result.problem) for a in hits if a.result is not None}
    if len(problems) > 1:
        shapes = "; ".join(f"{a.backend} at {_shape(a)}" for a in hits)
        return False, f"times of different shapes (nearest in the bucket) do not compare ({shapes})"
    if len(hits) == 1:
        return True, f"only {hits[0].backend} has a validated record"
    return True, f"all timed on {hits[0].device}"


def _shape(answer: BackendAnswer) -> str:
    problem = {} if answer.result is None else answer.result.problem or {}
    return ",".join(f"{k}={v}" for k, v in problem.items())
