"""Why a key missed: the nearest records of its kernel and backend, what differs, what serves them.

:func:`explain` compares a wanted key with tuned keys field by field (source hash, dtype, device,
environment versions, shape) and names the version policy under which each would be served by the
lookup rules (:func:`tunecache.rules.match`), or says that none would.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tunecache.key import problem_text
from tunecache.policies import VersionPolicy, shape_distance
from tunecache.rules import Rule, match

POLICIES: tuple[VersionPolicy, ...] = ("strict", "compatible", "any")


@dataclass(frozen=True)
class Nearby:
    """A tuned key near the wanted one: what differs, and the loosest-needed policy serving it."""

    record_id: int
    differences: tuple[str, ...]
    served_under: VersionPolicy | None  # the strictest policy under which it serves; None: never
    rule: Rule | None


def differences(wanted: Mapping[str, Any], tuned: Mapping[str, Any]) -> list[str]:
    """Each difference between two keys, as a short phrase (``dtype float16, not float32``)."""
    found: list[str] = []
    for name in ("source_hash", "dtype"):
        if wanted[name] != tuned[name]:
            found.append(f"{name} {tuned[name]}, not {wanted[name]}")
    device, here = tuned["device"], wanted["device"]
    if device["arch"] != here["arch"]:
        found.append(f"device arch {device['arch']}, not {here['arch']}")
    elif device != here:
        found.append(f"another device of the arch ({device['name']}, {device['units']} units)")
    env, wanted_env = tuned["environment"], wanted["environment"]
    for package in sorted(set(env) | set(wanted_env)):
        if env.get(package) != wanted_env.get(package):
            found.append(f"{package} {env.get(package, 'absent')}, not "
                         f"{wanted_env.get(package, 'absent')}")  # fmt: skip
    if tuned["problem"] != wanted["problem"]:
        found.append(f"shape {problem_text(tuned['problem'])}")
    return found


def explain(
    wanted: Mapping[str, Any], tuned: Iterable[tuple[int, Mapping[str, Any]]], limit: int = 5
) -> list[Nearby]:
    """The ``limit`` records nearest ``wanted`` (fewest differences, then closest shape)."""
    ranked = []
    for record_id, key in tuned:
        diff = differences(wanted, key)
        served: tuple[VersionPolicy, Rule] | None = next(
            ((p, r) for p in POLICIES if (r := match(wanted, key, p)) is not None), None
        )
        distance = shape_distance(wanted["problem"], key["problem"])
        ranked.append((len(diff), distance, record_id,
                       Nearby(record_id, tuple(diff), *(served or (None, None)))))  # fmt: skip
    ranked.sort(key=lambda item: item[:3])
    return [item[3] for item in ranked[:limit]]
