"""Which kernels a worker runs, and whether they changed under it: the users' kernel packages it
may import (checked before any claim), the built-in kernels' versions it read at its start, and
whether the sources on disk are still those (a pull under a running daemon)."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from tunecache.errors import InvalidInput
from tunecache.kernels import builtin_names, get_kernel


def importable(packages: Sequence[str]) -> tuple[str, ...]:
    """``packages`` when each is a package name a claim may carry and its top-level package can
    be found here (found, not imported: nothing runs yet).

    Raises:
        InvalidInput: naming one that is not, so no job for it is claimed only to fail.
    """
    from pydantic import ValidationError

    from tunecache.jobs import ClaimRequest

    try:  # what a claim carries
        ClaimRequest(worker="-", kernel_packages=list(packages))
    except ValidationError:
        raise InvalidInput(f"kernel packages {', '.join(packages)}: expected at most 64 dotted "
                           "package names (letters, digits, _)") from None  # fmt: skip
    for package in packages:
        top = package.partition(".")[0]
        if importlib.util.find_spec(top) is None:
            raise InvalidInput(f"kernel package {top!r} cannot be imported here (not installed, "
                               f"and not in the current directory)")  # fmt: skip
    return tuple(packages)


def builtin_versions(backends: Sequence[str]) -> dict[tuple[str, str], str]:
    """The source hash here of each built-in kernel on each of ``backends`` it runs on."""
    specs = [get_kernel(name) for name in builtin_names()]
    return {(s.name, b): s.source_hash(b) for s in specs for b in backends if b in s.dtypes}


def changed_on_disk(versions: dict[tuple[str, str], str]) -> str | None:
    """Why this process's kernels are not those on disk now (``None``: they are): a pull under
    a running daemon tuned the new code, in the processes its harness starts, under the
    version it had read, served to processes of that version, never checked with its code."""
    for (kernel, backend), read in versions.items():
        if (now := get_kernel(kernel).source_hash(backend, now=True)) != read:
            return (f"{kernel}'s sources for {backend} changed on disk since this daemon read "
                    f"them (source hash {read}, now {now}): it would tune the new code under "
                    "the old version's keys; restart it")  # fmt: skip
    return None
