"""Kernel configs as values, and the discrete spaces they are drawn from.

A :class:`Config` is a frozen, hashable mapping of parameter name to a JSON scalar, so timings can
be ``dict[Config, float]`` and a config travels as canonical JSON. A :class:`SearchSpace` names
each parameter's choices (categorical, ordered as given) and an optional constraint that prunes
configs before anything is compiled.

Example:
    >>> def too_big(c):
    ...     return "too big" if c["BLOCK_M"] * c["num_warps"] > 256 else None
    >>> space = SearchSpace({"BLOCK_M": (32, 64), "num_warps": (4, 8)}, constraint=too_big)
    >>> [str(c) for c in space.configs()]
    ['BLOCK_M=32 num_warps=4', 'BLOCK_M=32 num_warps=8', 'BLOCK_M=64 num_warps=4']
    >>> space.size, space.pruned_count()
    (4, 1)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tunecache.canonical import digest
from tunecache.errors import InvalidInput, one_line

Scalar = int | float | str | bool
Constraint = Callable[["Config"], str | None]  # returns why a config is pruned, or None
# The most configs a space's enumeration walks: a search holds every one (390,625 took 1.5 s
# and 0.3 GB, the default search's arms 0.7 GB), and a product of ten parameters' choices is
# soon beyond any machine; a space that only answers contains() may be of any size.
MAX_WALKED = 1_000_000


@dataclass(frozen=True)
class Config(Mapping[str, Scalar]):
    """An immutable kernel config: a read-only mapping of parameter name to JSON scalar, kept as
    sorted ``(name, value)`` pairs, so it hashes and compares by value. It is the one type of a
    config in the process: anything that reads a mapping reads it, and it becomes a ``dict`` only
    where it leaves as JSON (:meth:`to_json`)."""

    pairs: tuple[tuple[str, Scalar], ...]

    def __post_init__(self) -> None:
        for name, value in self.pairs:
            if not isinstance(name, str) or not isinstance(value, int | float | str | bool):
                raise InvalidInput(f"config parameter {name!r}={value!r} is not a JSON scalar")

    @classmethod
    def of(cls, values: Mapping[str, Scalar]) -> Config:
        """``values`` as a config (a config is returned as it is)."""
        if isinstance(values, Config):
            return values
        return cls(tuple(sorted(values.items())))

    @classmethod
    def _checked(cls, pairs: tuple[tuple[str, Scalar], ...]) -> Config:
        """A config of ``pairs`` already sorted by name and checked to be JSON scalars (a
        space checks its choices once, not each config's: enumerating 20,736 configs took
        0.11 s, now 0.06 s)."""
        config = object.__new__(cls)
        object.__setattr__(config, "pairs", pairs)
        return config

    from_json = of

    def to_json(self) -> dict[str, Scalar]:
        return dict(self.pairs)

    def __getitem__(self, name: str) -> Scalar:
        for key, value in self.pairs:
            if key == name:
                return value
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self.pairs)

    def __len__(self) -> int:
        return len(self.pairs)

    def replace(self, **values: Scalar) -> Config:
        return Config.of({**self.to_json(), **values})

    def digest(self) -> str:
        return digest(self.to_json())

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.pairs)


def kinded(value: Any) -> tuple[str, Any]:
    """``value`` with its kind: ``True``, ``1`` and ``1.0`` are equal in Python and hash alike,
    but they are three configs (``True`` a flag, ``1.0`` no tile size). Hashing the pair raises
    ``TypeError`` for a list or a dict, as hashing the value does."""
    for kind in (bool, int, float, str):  # bool first: a bool is an int too
        if isinstance(value, kind):
            return kind.__name__, value
    return type(value).__name__, value


def _is_scalar(value: Any) -> bool:
    """Whether ``value`` is a JSON scalar a config may hold (a finite float, no ``None``)."""
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, int | str | bool)


def _distinct(name: str, choices: Iterable[Any]) -> tuple[Scalar, ...]:
    """A parameter's choices, each once (a repeat dropped: choices computed from a shape may
    meet, and a space with a config twice had the default search ask for ever).

    Raises:
        InvalidInput: no choices; a choice that is not a JSON scalar; two choices equal as
            values but of other kinds (``1`` and ``True``, ``1`` and ``1.0``).
    """
    kept: dict[Scalar, Scalar] = {}
    for choice in choices:
        if not _is_scalar(choice):
            raise InvalidInput(f"search space parameter {name!r}: choice {choice!r} is not a "
                               "JSON scalar (an int, float, str or bool, finite)")  # fmt: skip
        first = kept.setdefault(choice, choice)
        if kinded(first)[0] != kinded(choice)[0]:
            raise InvalidInput(f"search space parameter {name!r}: choices {first!r} and "
                               f"{choice!r} are equal values of other types; a config "
                               "could not tell them apart")  # fmt: skip
    if not kept:
        raise InvalidInput(f"search space parameter {name!r} has no choices")
    return tuple(kept.values())


@dataclass(frozen=True)
class SearchSpace:
    """The cartesian product of each parameter's choices, minus what ``constraint`` prunes.

    ``members``, when given, lists the valid configs outright (a recorded landscape: its
    product may be a thousand times larger than what was measured): :meth:`configs` then walks
    them, not the product, and a config outside them is pruned.

    ``defaults`` gives the value a config that lacks a parameter means (a parameter added to a
    kernel after records were tuned: ``{"SPLIT_K": 1}``); :meth:`complete` fills them in.
    """

    params: Mapping[str, tuple[Scalar, ...]]
    constraint: Constraint | None = field(default=None, compare=False)
    members: tuple[Config, ...] | None = field(default=None, compare=False)
    defaults: Mapping[str, Scalar] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.params:
            raise InvalidInput("a search space needs at least one parameter")
        if bad := [name for name in self.params if not isinstance(name, str)]:
            raise InvalidInput(f"search space parameter names must be strings, got {bad!r}")
        params = {name: _distinct(name, choices) for name, choices in self.params.items()}
        object.__setattr__(self, "params", params)
        offered = {name: frozenset(map(kinded, choices)) for name, choices in params.items()}
        object.__setattr__(self, "_offered", offered)
        for name, value in self.defaults.items():
            if not self._offers(name, value):
                raise InvalidInput(f"default {name}={value!r} is not one of the space's choices")
        if self.members is not None:
            members = tuple(dict.fromkeys(self.members))
            for config in members:  # each as the kinds offered: Config holds 1 == 1.0 == True
                if (why := self._offer_problem(config)) is not None:
                    raise InvalidInput(f"recorded config {config} is not of the space: {why}")
            object.__setattr__(self, "members", members)
            object.__setattr__(self, "_member_set", frozenset(members))

    @property
    def size(self) -> int:
        """Configs before pruning."""
        n = 1
        for choices in self.params.values():
            n *= len(choices)
        return n

    def complete(self, config: Config) -> Config:
        """``config`` with the parameters it lacks set to their :attr:`defaults`."""
        missing = {k: v for k, v in self.defaults.items() if config.get(k) is None}
        return config.replace(**missing) if missing else config

    def prune_reason(self, config: Config) -> str | None:
        """Why ``config`` is outside the space (a value not offered, or the constraint), or None.

        A parameter it lacks counts as its default, where the space has one.
        """
        config = self.complete(config)
        if (why := self._offer_problem(config)) is not None:
            return why
        if self.members is not None and config not in self.__dict__["_member_set"]:
            return "not one of the space's recorded configs"
        return self._constraint_says(config)

    def _offer_problem(self, config: Config) -> str | None:
        """Why ``config`` does not set every parameter to one of its choices, or None."""
        if set(config) != set(self.params):
            return f"parameters {sorted(config)} are not {sorted(self.params)}"
        for name, value in config.pairs:
            if not self._offers(name, value):
                return f"{name}={value!r} is not one of {self.params[name]}"
        return None

    def _offers(self, name: str, value: Any) -> bool:
        """Whether ``value`` is one of parameter ``name``'s choices, as the kind it was offered
        (``True`` is not ``1``, ``64.0`` not ``64``)."""
        offered: frozenset[tuple[str, Scalar]] = self.__dict__["_offered"].get(name, frozenset())
        return _is_scalar(value) and kinded(value) in offered

    def _constraint_says(self, config: Config) -> str | None:
        """The constraint's reason to prune ``config``, or None.

        Raises:
            InvalidInput: the constraint answered neither a reason (a ``str``) nor None (a
                ``bool`` could mean "keep" as well as "prune"), or raised (a user's predicate
                reading a parameter the space lacks): named, with the config.
        """
        if self.constraint is None:
            return None
        try:
            why = self.constraint(config)
        except Exception as exc:
            raise InvalidInput(f"the space's constraint raised {one_line(exc)} for {config}") \
                from exc  # fmt: skip
        if why is not None and not isinstance(why, str):
            raise InvalidInput(f"the space's constraint answered {why!r} for {config}: it "
                               "must return why the config is pruned (a str), or None")  # fmt: skip
        return why

    def contains(self, config: Config) -> bool:
        return self.prune_reason(config) is None

    def all_configs(self) -> Iterator[Config]:
        """Every config of the product, pruned or not, in a fixed order."""
        names = list(self.params)
        by_name = sorted(range(len(names)), key=names.__getitem__)
        sorted_names = [names[i] for i in by_name]
        for values in itertools.product(*(self.params[n] for n in names)):
            yield Config._checked(
                tuple(zip(sorted_names, [values[i] for i in by_name], strict=True))
            )

    def configs(self) -> Iterator[Config]:
        """Every config that survives pruning, in a fixed order.

        Raises:
            InvalidInput: the product is larger than :data:`MAX_WALKED` configs (no members).
        """
        if self.members is None and self.size > MAX_WALKED:
            sizes = ", ".join(f"{name}: {len(choices)}" for name, choices in self.params.items())
            raise InvalidInput(f"the space has {self.size:,} configs ({sizes}), more than the "
                               f"{MAX_WALKED:,} a search walks: narrow some parameter's "
                               "choices")  # fmt: skip
        every = self.members if self.members is not None else self.all_configs()
        return (c for c in every if self._constraint_says(c) is None)

    def valid(self) -> tuple[Config, ...]:
        """Every config that survives pruning, in :meth:`configs`' order, made once and shared:
        a search's strategies each need them all (walking 20,736 took 0.15 s each time)."""
        cached: tuple[Config, ...] | None = self.__dict__.get("_valid")
        if cached is None:
            cached = tuple(self.configs())
            object.__setattr__(self, "_valid", cached)
        return cached

    def pruned_count(self) -> int:
        return self.size - sum(1 for _ in self.configs())

    def to_json(self) -> dict[str, list[Scalar]]:
        return {name: list(choices) for name, choices in self.params.items()}
