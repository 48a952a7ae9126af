"""What the drop-in launches in place of a tuned pick that failed validation.

The fastest config that passes the same check on fresh copies of the call's arguments: the
configs this call timed, fastest first (ties in the kernel's order), then the other configs the
kernel keeps for the call, in its order. Each is checked at most once and the search stops at the
first that passes, so it costs at most one check (two launches) per config the kernel keeps, a
handful. When none passes, the fastest whose check could not run here is launched (not known
wrong, unlike the pick); when every config ran and disagreed, the reference itself is the
likeliest culprit: :func:`fall_back` says so and the caller launches what Triton would have.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from triton import Config

from tunecache.schemas import MAX_TRIAL_ERROR, TrialStatus

# A trial's status and what it says (Trial.error), for the config it names.
Mark = tuple[Config, TrialStatus, str]


@dataclass(frozen=True)
class Fallback:
    """The config to launch in place of ``failed`` (``None``: none passed), how many configs
    were tried, those tried whose check could not run here (``unsure``, fastest first: not known
    wrong, unlike ``failed``, nor right), and those tried that failed their check (``wrong``)."""

    config: Config | None
    checked: int
    failed: Config
    unsure: tuple[Config, ...] = ()
    wrong: tuple[Config, ...] = ()

    @property
    def unchecked(self) -> Config | None:
        """The fastest config tried whose check could not run here, if any."""
        return self.unsure[0] if self.unsure else None

    @property
    def launched(self) -> Config:
        """What runs: the config that passed, else one not known wrong, else Triton's pick
        (every config disagreed with the reference: the reference is the suspect)."""
        return self.config or self.unchecked or self.failed

    def warning(self, said: str, launch: str, then: str = "not uploaded") -> str:
        """The one warning: ``said`` (the pick's failure), then what ``launch`` runs and why;
        ``then``: what becomes of the config that passed (:func:`shared`)."""
        if self.config is None and self.unchecked is not None:
            return (f"{said}; {launch} launch {self.unchecked}, the fastest config whose check "
                    f"could not run here (none of the {self.checked} tried passed): unchecked, "
                    "but not known wrong; not uploaded")  # fmt: skip
        if self.config is None:
            return (f"{said}, and so did the {self.checked} other config(s) the kernel keeps: "
                    f"the reference may be wrong; {launch} launch {self.failed}, Triton's pick, "
                    "unchecked; not uploaded")  # fmt: skip
        return (f"{said}; {launch} launch {self.config}, the fastest config that passed "
                f"(checked {self.checked}): {then}")  # fmt: skip


def candidates(failed: Config, times: Mapping[Config, Any], kept: Sequence[Config]) -> list[Config]:
    """The configs to try in place of ``failed``, in order: those this call timed (``times``:
    Triton's ``do_bench`` answers), fastest first, never one that could not run; then the rest of
    ``kept`` (the configs the kernel keeps for the call), in its order."""
    order = {id(config): i for i, config in enumerate(kept)}
    timed = [c for c in times if c is not failed and math.isfinite(_ms(times[c]))]
    timed.sort(key=lambda c: (_ms(times[c]), order.get(id(c), len(order))))
    tried = {id(c) for c in timed} | {id(c) for c in times} | {id(failed)}
    return timed + [c for c in kept if id(c) not in tried and c != failed]


def fall_back(failed: Config, times: Mapping[Config, Any], kept: Sequence[Config],
              passes: Callable[[Config], bool | None]) -> Fallback:  # fmt: skip
    """The first of :func:`candidates` for which ``passes(config)`` (its check on fresh inputs)
    holds, each checked at most once; ``passes`` answers ``None`` where the check could not
    run here (no memory for the copies, the reference raising): such a config is remembered,
    never counted as disagreeing with the reference."""
    checked, unsure, wrong = 0, list[Config](), list[Config]()
    for config in candidates(failed, times, kept):
        checked += 1
        verdict = passes(config)
        if verdict:
            return Fallback(config, checked, failed, tuple(unsure), tuple(wrong))
        (unsure if verdict is None else wrong).append(config)
    return Fallback(None, checked, failed, tuple(unsure), tuple(wrong))


SHARED = "the key's record in its place"


def shared(found: Fallback, times: Mapping[Config, Any], reference: bool) -> str:
    """What becomes of the config that passed in the wrong pick's place: :data:`SHARED` (the
    drop-in uploads it) when this call timed it and the check was against the kernel's
    ``reference``; against its first config, a disagreement proves neither wrong (a wrong
    first config would be served, the right ones marked wrong), so it is not uploaded."""
    if not reference:
        return ("not uploaded (checked against the kernel's first config, with no reference= "
                "to tell which of them is wrong)")  # fmt: skip
    if (
        found.config is None
        or found.config not in times
        or not math.isfinite(_ms(times[found.config]))
    ):
        return "not uploaded (not timed here)"
    return SHARED


UNSURE = "not validated: its check could not run"  # records show keeps 40 characters


def reasons(found: Fallback, checks: Mapping[int, Any]) -> tuple[Mark, ...]:
    """What each trial of the record must say beyond its time: each config known wrong (the
    failed pick, then those tried) ``wrong_answer`` and why (what its check, ``checks`` by
    ``id``, found, or, ``None``, that its run raised in it); each tried whose check could not run
    (faster than the winner: tried before it) stays ``ok``, saying it was not validated."""
    known = (found.failed, *found.wrong)
    return (*((c, "wrong_answer", "its run raised in the check" if (check := checks.get(id(c)))
               is None else f"failed the check: {check.failure()}"[:MAX_TRIAL_ERROR])
              for c in known),
            *((c, "ok", UNSURE) for c in found.unsure))  # fmt: skip


def could_not_run(times: Mapping[Config, Any], config: Config) -> bool:
    """Whether ``config`` was timed as one that cannot run (never faster: infinite)."""
    return config in times and not math.isfinite(_ms(times[config]))


def _ms(measured: Any) -> float:
    """A ``do_bench`` answer's time: the number, or the first of its quantiles."""
    if isinstance(measured, int | float):
        return float(measured)
    try:
        return float(measured[0])
    except (TypeError, IndexError, ValueError):
        return math.inf
