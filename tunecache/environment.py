"""The software versions a tuned config depends on.

Each backend depends on a few packages; their versions go into the key so a record tuned under
Triton 3.6 is never served as if it had been tuned under Triton 3.9. Versions come from package
metadata: nothing is imported.
"""

from __future__ import annotations

import functools
from importlib import metadata

from tunecache.kernels import BACKENDS

# The distributions whose version can change which config wins (or whether it runs).
BACKEND_PACKAGES: dict[str, tuple[str, ...]] = {
    "tvm": ("apache-tvm",),
    "inductor": ("torch", "triton"),
    "triton": ("triton", "torch"),
}
assert set(BACKEND_PACKAGES) == set(BACKENDS), "one list of backend names: kernels.BACKENDS"


@functools.cache
def package_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or ``None`` when it is absent."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def environment_for(backend: str) -> dict[str, str]:
    """``{distribution: version}`` for the packages ``backend`` depends on (absent ones skipped)."""
    try:
        packages = BACKEND_PACKAGES[backend]
    except KeyError:
        raise ValueError(
            f"unknown backend {backend!r}; expected one of {sorted(BACKEND_PACKAGES)}"
        ) from None
    found = {name: package_version(name) for name in packages}
    return {name: version for name, version in found.items() if version is not None}
