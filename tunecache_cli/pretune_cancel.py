"""``tunecache pretune MANIFEST --cancel``: cancel the manifest's open jobs instead of queuing
them (a manifest queued by mistake, a deployment called off): each ends ``failed``, "cancelled
by" this token, and daemons claim it no more (one running it loses its lease). Before, a queued
manifest ran to its end, every daemon's time spent on it, unless an operator edited the database.

Only the jobs this token queued are its to cancel (an admin token's: any); another caller's are
left, named. Exit 0 when every open job of the manifest was cancelled, 4 when some were another
caller's, 3 server unreachable (as ``pretune``).
"""

from __future__ import annotations

import sys
from typing import Any

from tunecache.jobs import OPEN_STATES
from tunecache_cli.job_reads import all_jobs
from tunecache_cli.table import counted, shown

NAMED = 5  # keys named of the jobs left open; the rest counted


def cancel(client: Any, manifest: Any) -> int:
    """Cancels the open jobs of ``manifest``'s keys on ``client``'s server and says what it did;
    0 when none is left open.

    Raises:
        ServerError: some were another caller's (403, naming them: exit 4), the server is
            unreachable, or it refused otherwise (a 404 of no such route: one older than it).
    """
    from tunecache.errors import ServerError

    keys = {key.digest(): key for key in manifest.keys}
    jobs = all_jobs(client, list(keys))
    open_jobs = [job for digest, job in jobs.items() if digest in keys and job.state in OPEN_STATES]
    cancelled, theirs = 0, []
    for job in open_jobs:
        try:
            client.cancel_job(job.id)
        except ServerError as exc:
            if exc.status_code == 403 and not exc.foreign:  # another caller queued it
                theirs.append(keys[job.key_hash])
            elif exc.status_code != 409:  # 409: it ended meanwhile (done, failed)
                print(f"{counted(cancelled, 'job')} cancelled before this error",
                      file=sys.stderr)  # fmt: skip
                raise
            continue
        cancelled += 1
    idle = len(keys) - cancelled - len(theirs)  # no job, or none open (ended meanwhile too)
    print(f"{counted(len(keys), 'key')}: {counted(cancelled, 'job')} cancelled, "
          f"{len(theirs)} another caller's, {idle} with no queued or running job",
          file=sys.stderr)  # fmt: skip
    if not theirs:
        return 0
    named = ", ".join(shown(key.short()) for key in theirs[:NAMED])
    more = f" and {len(theirs) - NAMED} more" if len(theirs) > NAMED else ""
    raise ServerError(f"{counted(len(theirs), 'job')} left open, queued by another caller "
                      f"(only it or an admin token may cancel them): {named}{more}",
                      status_code=403)  # fmt: skip
