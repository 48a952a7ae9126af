"""Lookup policies: which cached winners may serve a key that has no exact entry.

* **Shape buckets.** A workload's batch-like dimensions (the rows ``M`` of a GEMM or a norm) vary
  at run time; a winner tuned at ``M=3000`` serves ``M=2500`` when both fall in the same bucket
  (the next power of two: 2049…4096). The other dimensions (the model's widths) must match.
* **Versions.** ``strict``: the same versions of every package the backend depends on;
  ``compatible``: the same major.minor; ``any``: whatever was tuned.

Example:
    >>> bucket_policy("matmul").bucket({"M": 3000, "N": 4096, "K": 4096})
    {'K': 4096, 'M': 4096, 'N': 4096}
    >>> versions_match({"torch": "2.11.0"}, {"torch": "2.11.1"}, "compatible")
    True
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

VersionPolicy = Literal["strict", "compatible", "any"]
VERSION_POLICIES: tuple[VersionPolicy, ...] = ("strict", "compatible", "any")


def next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class BucketPolicy:
    """Dimensions rounded up to the next power of two before keys are compared."""

    dims: tuple[str, ...]

    @property
    def name(self) -> str:
        return "pow2(" + ",".join(self.dims) + ")" if self.dims else "exact"

    def bucket(self, problem: Mapping[str, Any]) -> dict[str, Any]:
        return {  # a flag is not a size: True stays True
            k: next_power_of_two(v) if k in self.dims and type(v) is int else v
            for k, v in sorted(problem.items())
        }


EXACT = BucketPolicy(())


def widest_bucket(problem: Mapping[str, Any]) -> dict[str, Any]:
    """The problem with every size rounded up to the next power of two: the bucket of the policy
    that rounds every dimension. Two problems in one bucket of any policy are in one of this, so
    an index by it finds a key's bucket mates whatever dimensions its caller rounds."""
    return {k: next_power_of_two(v) if type(v) is int else v for k, v in sorted(problem.items())}


def bucket_policy(kernel: str) -> BucketPolicy:
    """The bucket policy of the registered kernel called ``kernel`` (its ``bucket``); exact shapes
    for a kernel this process has not registered (a server never imports users' kernels: a
    lookup says its caller's, :class:`tunecache.schemas.LookupRequest`)."""
    from tunecache.kernels import registered

    spec = registered(kernel)
    return EXACT if spec is None else BucketPolicy(spec.bucket)


def server_bucket(kernel: str) -> BucketPolicy | None:
    """A built-in kernel's bucket policy, which every server knows; ``None`` for any other
    kernel (a user's, whatever its name: a server never imports one)."""
    from tunecache.builtin import BUILTIN

    spec = next((spec for spec in BUILTIN if spec.name == kernel), None)
    return None if spec is None else BucketPolicy(spec.bucket)


def caller_bucket(kernel: str) -> list[str] | None:
    """The bucket dimensions a lookup of ``kernel`` tells the server
    (:class:`tunecache.schemas.LookupRequest`): those of a kernel registered here that is not
    built-in (a user's, which a server never imports); ``None`` for a built-in (the server knows
    its bucket) or a kernel without one (and a server older than the field reads that request)."""
    dims = bucket_policy(kernel).dims
    return list(dims) if dims and server_bucket(kernel) is None else None


def shape_distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """Sum of |log2(a/b)| over the integer parameters both problems share (∞ if none)."""
    common = [k for k in a if k in b and isinstance(a[k], int) and isinstance(b[k], int)]
    if not common:
        return math.inf
    return sum(abs(math.log2(a[k] / b[k])) for k in common if a[k] > 0 and b[k] > 0)


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(re.split(r"[.+]", version)[:2])


def versions_match(
    wanted: Mapping[str, str], tuned: Mapping[str, str], policy: VersionPolicy
) -> bool:
    """Whether a record tuned under ``tuned`` versions may serve a caller with ``wanted``."""
    if policy == "any":
        return True
    if set(wanted) != set(tuned):
        return False
    if policy == "strict":
        return dict(wanted) == dict(tuned)
    return all(_major_minor(wanted[p]) == _major_minor(tuned[p]) for p in wanted)
