"""``tunecache coverage MANIFEST``: which of a manifest's keys are tuned, stale, queued or missing.

*tuned*: a winner serves the key under the manifest's version policy; *stale*: one serves it only
when versions are ignored (tuned under other versions); *queued* / *failed*: a job holds it;
*missing*: nothing. A tuned key whose winner ran slower than torch eager has a note saying so; a
failed key's note is its job's attempts and last error; a queued one's, its last error (it waits
for a retry, or was queued again).
Exit 0 only when every key is tuned, 1 otherwise, 2 bad input, 3 unreachable.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunecache_cli.args import add_server, server_url
from tunecache_cli.table import counted

if TYPE_CHECKING:
    from tunecache.key import Key
    from tunecache.manifest import Manifest


def register(commands: Any) -> None:
    parser = commands.add_parser("coverage", help="which of a manifest's keys are tuned")
    parser.add_argument("manifest", type=Path, metavar="MANIFEST.toml")
    parser.add_argument("--json", action="store_true",
                        help="the keys' states and totals as one JSON document")  # fmt: skip
    add_server(parser)
    parser.set_defaults(run=run)


def state_of(key: Any, client: Any, anyway: Any, jobs: dict[str, Any]) -> tuple[str, str]:
    """Tuned: the server answers a record a process would use (not any answer: the server is
    not trusted); stale: one under another version policy; else the key's job's state. With a
    note: a tuned key's winner that ran slower than torch eager says so (tuned, but not using
    the kernel would be faster); a failed job's attempts and last error (a queued job's last
    error: it waits for its retry, or was queued again), else a team's only way to learn why
    was the daemon's log.
    """
    from tunecache_cli.pretune import is_tuned, last_error, served, why_failed

    if (answer := served(key, client)) is not None:
        slower = answer.record.slower_than_eager
        return "tuned", f"record {answer.record.id} is slower than torch eager" if slower else ""
    if is_tuned(key, anyway):
        return "stale", ""
    job = jobs.get(key.digest())
    if job is not None and job.state in ("queued", "running", "failed"):
        note = why_failed(job) if job.state == "failed" else ""
        if job.state == "queued" and job.error:  # waits for its retry, or queued again: what
            note = f"last error: {last_error(job)}"  # ended the last run (not an attempt count)
        return ("failed" if job.state == "failed" else "queued"), note
    return "missing", ""


def manifest_states(
    manifest: Manifest, url: str, keys: Sequence[Key] | None = None
) -> list[tuple[Key, str, str]]:
    """Each of ``keys`` (default: the manifest's) with its state on the server at ``url``, under
    the manifest's version policy, and its note (:func:`state_of`; ``tunecache report`` draws
    the states too).

    Raises:
        ServerError: the server is unreachable or refused.
    """
    from tunecache.client import Client
    from tunecache_cli.job_reads import all_jobs
    from tunecache_cli.progress import asking

    keys = manifest.keys if keys is None else keys
    with (Client(url, policy=manifest.policy) as client, Client(url, policy="any") as anyway,
          asking("coverage", url)):  # fmt: skip
        jobs = all_jobs(client, [key.digest() for key in keys])
        return [(key, *state_of(key, client, anyway, jobs)) for key in keys]


def run(args: argparse.Namespace) -> int:
    from tunecache.manifest import load_manifest
    from tunecache_cli.table import render

    manifest = load_manifest(args.manifest)
    states = manifest_states(manifest, server_url(args))
    totals = {s: sum(1 for _, st, _ in states if st == s) for s in
              ("tuned", "stale", "queued", "failed", "missing")}  # fmt: skip
    summary = ", ".join(f"{n} {s}" for s, n in totals.items())
    summary += f" of {counted(len(states), 'key')}"
    if slower := sum(1 for _, st, note in states if st == "tuned" and note):
        summary += f"\nslower than torch eager: {counted(slower, 'tuned key')} (see the note)"
    if args.json:  # one document, as every --json prints; the summary on stderr
        keys = [{"key": key.short(), "digest": key.digest(), "state": state, "note": note}
                for key, state, note in states]  # fmt: skip
        print(json.dumps({"keys": keys, "totals": totals, "slower_than_eager": slower}, indent=2))
    elif any(note for _, _, note in states):
        rows = [[key.short(), state, note] for key, state, note in states]
        print(render(["key", "state", "note"], rows))
    else:
        print(render(["key", "state"], [[key.short(), state] for key, state, _ in states]))
    print(summary, file=sys.stderr if args.json else sys.stdout)  # --json: stdout is JSON only
    return 0 if totals["tuned"] == len(states) else 1
