"""The fastest backend for a kernel × problem × dtype × device, with the others' times beside it.

Each backend has its own key (its own source hash and environment), so :func:`best_backend` builds
one key per backend the kernel supports in the dtype, resolves each through a
:class:`~tunecache.resolver.Resolver` (validated records only; no default config counts) and ranks
the answers by their records' median times. torch eager is a contender too: every record was
timed against it in alternating rounds, and where the fastest record's comparison found eager
measurably faster, :attr:`BestBackend.eager_faster` says so.

Times are comparable only when they were measured on one device (:attr:`BackendAnswer.machine`:
its name, and its cores or SMs and memory where the record says them): a record served by the
``same_arch`` rule was timed on another device of the arch, and a GPU backend's record on another
kind of device than a CPU backend's. :class:`BestBackend` says whether they were, and why not;
when they were not, no backend is crowned. A time taken by Triton's interpreter on the host
(:attr:`~tunecache.measured.TimingModel.interpreted`) says nothing of a GPU's: its row is listed,
never ranked. Two medians each inside the other record's spread (its fastest to slowest sample)
are the same within their spreads (:attr:`BestBackend.tied`), not one faster.

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
from tunecache.key import Key, key_for, problem_text
from tunecache.tokens import name_text

if TYPE_CHECKING:
    from tunecache.device import Device, DeviceFingerprint
    from tunecache.lookup import LookupResult
    from tunecache.measured import TimingModel


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

    @property
    def machine(self) -> str | None:
        """The device that measured :attr:`time_ms` as closely as the record names it (``None``
        on a miss): a verifier's by its name and the verifier's, once a verifier re-timed it
        (its cores are not recorded), else the record's own device with its cores or SMs and
        memory. A CPU's name alone is generic (``intel-xeon-processor``): a 64-core box's time
        was ranked against a 2-core box's."""
        served = None if self.result is None else self.result.served_record
        record = None if self.result is None else self.result.record
        if served is None:
            return self.device
        if self.by_verifier and record is not None and record.verification is not None:
            return f"{self.device} (verifier {name_text(record.verification.verifier)})"
        device = served.key.device
        units = f"{device.units} {'cores' if device.kind == 'cpu' else 'SMs'}"
        memory = f", {device.memory_gb} GB" if device.memory_gb else ""
        return f"{device.arch} {device.name} ({units}{memory})"

    @property
    def on_cpu(self) -> bool:
        """Whether the record's device is a CPU, whose name does not tell machines apart."""
        served = None if self.result is None else self.result.served_record
        return served is not None and served.key.device.kind == "cpu"

    @property
    def timing(self) -> TimingModel | None:
        """The timing :attr:`time_ms` is the median of: the verifier's once a verifier re-timed
        the record, else the uploader's (``None`` on a miss)."""
        if self.result is None:
            return None
        if self.result.record is not None:
            return self.result.record.believed_timing
        served = self.result.served_record
        return None if served is None else served.timing

    @property
    def by_verifier(self) -> bool:
        """Whether :attr:`time_ms` is a verifier's re-timing, not the uploader's own."""
        record = None if self.result is None else self.result.record
        return record is not None and record.believed_timing is not record.timing

    @property
    def status(self) -> str | None:
        """The served record's status on the server (``pending``: its uploader's claim, checked
        by no verifier; ``verified``), or ``None`` on a miss or a snapshot's record."""
        record = None if self.result is None else self.result.record
        return None if record is None else record.status

    @property
    def interpreted(self) -> bool:
        """Whether Triton's interpreter timed it on the host: no GPU's time, never ranked."""
        return self.timing is not None and self.timing.interpreted

    @property
    def ranked(self) -> bool:
        """Whether its time takes part in the ranking: a hit not timed by an interpreter."""
        return self.time_ms is not None and not self.interpreted


@dataclass(frozen=True)
class BestBackend:
    """Every backend's answer, fastest first (interpreted times after the ranked ones, misses
    last), and whether the ranked times compare."""

    answers: tuple[BackendAnswer, ...]
    comparable: bool
    note: str

    @property
    def found(self) -> bool:
        """Whether any backend has a validated record (ranked or not)."""
        return any(a.time_ms is not None for a in self.answers)

    @property
    def winner(self) -> BackendAnswer | None:
        """The fastest ranked answer; ``None`` when no backend has a ranked record, or when the
        ranked times do not compare (measured on different devices or shapes)."""
        first = self.answers[0] if self.answers else None
        return first if self.comparable and first is not None and first.ranked else None

    @property
    def runner_up(self) -> BackendAnswer | None:
        """The second ranked answer, when there is a winner and another ranked answer."""
        ranked = [a for a in self.answers if a.ranked]
        return ranked[1] if self.winner is not None and len(ranked) > 1 else None

    @property
    def tied(self) -> tuple[BackendAnswer, ...]:
        """The ranked answers the same as the winner within their spreads: each median inside
        the other's timing from its fastest to its slowest sample (medians timed apart)."""
        winner = self.winner
        if winner is None:
            return ()
        return tuple(a for a in self.answers[1:] if a.ranked and _overlap(winner, a))

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
    answers.sort(key=lambda a: (a.time_ms is None, a.interpreted, a.time_ms or 0.0, a.backend))
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


def _overlap(one: BackendAnswer, other: BackendAnswer) -> bool:
    """Whether each one's median lies within the other's fastest-to-slowest samples."""
    a, b = one.timing, other.timing
    if a is None or b is None:
        return False
    return b.min_ms <= a.median_ms <= b.max_ms and a.min_ms <= b.median_ms <= a.max_ms


def _comparability(answers: Sequence[BackendAnswer]) -> tuple[bool, str]:
    interpreted = [a.backend for a in answers if a.interpreted]
    if not interpreted:
        return _ranked_comparability([a for a in answers if a.ranked], "")
    comparable, note = _ranked_comparability([a for a in answers if a.ranked], " that is ranked")
    return comparable, (f"{note}; {', '.join(interpreted)} timed by Triton's interpreter on the "
                        "host (no GPU's time): not ranked")  # fmt: skip


def _ranked_comparability(hits: Sequence[BackendAnswer], ranked: str) -> tuple[bool, str]:
    if not hits:
        return not ranked, f"no backend has a validated record{ranked}"
    # A GPU's name names its model (its SMs and memory): a verifier's, known by its name alone,
    # is the same device as an uploader's of that name. A CPU's name does not: a verifier's time
    # compares only with the same verifier's on a device of that name.
    uploaders = {a.machine or "" for a in hits if not a.by_verifier}
    machines = {a.machine for a in hits} if any(a.on_cpu for a in hits) else set()
    if len({a.device for a in hits}) > 1 or len(uploaders) > 1 or len(machines) > 1:
        where = "; ".join(f"{a.backend} on {a.machine}" for a in hits)
        return False, f"times measured on different devices are not comparable ({where})"
    problems = {canonical_json(a.result.problem) for a in hits if a.result is not None}
    if len(problems) > 1:
        shapes = "; ".join(f"{a.backend} at {_shape(a)}" for a in hits)
        return False, f"times of different shapes (nearest in the bucket) do not compare ({shapes})"
    if len(hits) == 1:
        return True, f"only {hits[0].backend} has a validated record{ranked}"
    by = ("; times: a verifier's (v) where a verifier re-timed the record, else its uploader's"
          if any(a.by_verifier for a in hits) else "")  # fmt: skip
    return True, f"all timed on {min(uploaders) if uploaders else hits[0].machine}{by}"


def _shape(answer: BackendAnswer) -> str:
    problem = {} if answer.result is None else answer.result.problem or {}
    return problem_text(problem)
