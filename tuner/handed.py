"""What a tuning daemon checks of a job a server handed it: that it is one the claim asked for.

A claim names this machine's arch, the backends it runs and, for ``pretune --local``, the keys it
tunes; a server is not trusted to answer with such a job only. A job for another arch was tuned
here for nothing (the record is keyed by this machine, so it answered no job: an honest server
refuses the completion, the attempt spent after the whole search); one for a backend not run here
failed later, with a less clear error.
"""

from __future__ import annotations

from collections.abc import Sequence

from tunecache.jobs import JobPublic
from tunecache.strict import shown


def unasked(
    job: JobPublic, arch: str, backends: Sequence[str], key_hashes: Sequence[str] | None
) -> str | None:
    """Why ``job`` is not one a claim for ``arch``, ``backends`` (and ``key_hashes``, unless
    ``None``) asked for, or ``None``."""
    asked = f"this worker claimed jobs for {arch} on {', '.join(backends)}"
    if job.key.device.arch != arch:
        return f"the server handed a job for {shown(job.key.device.arch)}; {asked}"
    if job.key.backend not in backends:
        return f"the server handed a job for the {job.key.backend} backend; {asked}"
    if key_hashes is not None and job.key.to_key().digest() not in key_hashes:
        return "the server handed a job for a key this worker did not ask for (pretune --local)"
    return None
