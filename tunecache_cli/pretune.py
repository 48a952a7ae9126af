"""``tunecache pretune MANIFEST``: queue a manifest's keys as tuning jobs and follow them.

Keys already tuned (under the manifest's version policy) or already queued are not queued again.
Then it follows the jobs to the end with a progress line (daemons do the tuning), or, ``--local``,
tunes them in this process, or, ``--ray [ADDRESS]``, as daemons running as Ray tasks
(:mod:`tuner.fanout`); ``--no-wait`` only queues. Exit 0 when every job is done, 1 when some
failed or a key's record waits for a verifier (its job done, nothing served), 2 bad input (a bad
manifest names its line; nothing is queued), 3 server unreachable.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from tunecache.errors import InvalidInput
from tunecache.settings import Settings
from tunecache_cli.args import add_server, check_trials, preflight, server_url
from tunecache_cli.job_reads import all_jobs
from tunecache_cli.table import counted, shown

RETRY_POLL_SECONDS = 2.0  # pretune --local: the least it waits before it looks again
MAX_LEASE_WAIT = 30.0  # and at most this long for a job leased elsewhere (a lease is renewed)
LAPSE_MARGIN = 3.0  # seconds past a lease's end before it is claimed (the server's clock may lag)
QUIET_LINE_SECONDS = 60.0  # off a terminal, a progress line when a count changes, else this often
UNCLAIMED_HINT_SECONDS = 30.0  # no job claimed this long: say how to start a worker, once
FAILED_NAMED = 10  # failed jobs named with their errors after following; the rest counted
ERROR_SHOWN = 200  # characters of a job's error's first line a note shows


def register(commands: Any) -> None:
    parser = commands.add_parser("pretune", help="queue a manifest's keys as tuning jobs")
    parser.add_argument("manifest", type=Path, metavar="MANIFEST.toml")
    where = parser.add_mutually_exclusive_group()  # both: --local tuned, then Ray found none
    where.add_argument("--local", action="store_true", help="tune the jobs in this process")
    where.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                        help="tune the jobs as Ray tasks (an existing cluster's address, or a "
                        "local Ray instance without one)")  # fmt: skip
    where.add_argument("--cancel", action="store_true",
                       help="cancel the manifest's queued and running jobs this token queued, "
                       "instead of queuing")  # fmt: skip
    parser.add_argument("--no-wait", action="store_true", help="queue, do not follow")
    parser.add_argument("--trials", type=int, default=32, help="--local, --ray: budget per key")
    parser.add_argument("--json", action="store_true",
                        help="print the followed jobs as JSON at the end (as queued, with "
                        "--no-wait)")  # fmt: skip
    add_server(parser)
    parser.set_defaults(run=run)


def served(key: Any, client: Any) -> Any:
    """``client``'s server's answer for ``key`` if it is one a process would use (its record
    may serve ``key``), else ``None``."""
    from tunecache.served import checked_answer

    return checked_answer(key, client.fetch_answer(key), client.policy)[0]


def is_tuned(key: Any, client: Any) -> bool:
    """Whether ``client``'s server answers ``key`` with a record a process would use."""
    return served(key, client) is not None


def queue(client: Any, manifest: Any) -> tuple[list[str], int, dict[str, list[Any]]]:
    """Queues the keys not tuned yet; returns the key hashes followed, how many were tuned, and
    the keys whose job is done with no record served, by why (:data:`UNSERVED`): not followed,
    as "done" they read as tuned again when nothing ran."""
    from tunecache.client import Client
    from tunecache.errors import ServerError

    followed, tuned, unserved = [], 0, {why: list[Any]() for why in UNSERVED}
    with Client(client.url, policy="any") as anyway:
        for key in manifest.keys:
            if is_tuned(key, client):  # a record a process would use, not any answer
                tuned += 1
                continue
            strategy, trials = manifest.budgets[key.digest()]
            job = client.create_job(key, strategy=strategy, trials=trials).job
            if job.key_hash != key.digest():  # followed, and --local claims, by this key's
                raise ServerError(f"POST /v1/jobs answered for {key.short()} with the job of "
                                  "another key: a bad answer")  # fmt: skip
            if job.state == "done" and is_tuned(key, client):  # done meanwhile
                tuned += 1
            elif job.state == "done":
                unserved[_why_unserved(key, anyway)].append(key)
            else:
                followed.append(job.key_hash)
    return followed, tuned, unserved


def _why_unserved(key: Any, anyway: Any) -> str:
    """Why a key tuned (its job done) is not served: ``stale`` where a client taking any
    versions (``anyway``) is served it, else ``unchecked`` (:data:`UNSERVED`)."""
    return "stale" if is_tuned(key, anyway) else "unchecked"


def unserved_after(
    client: Any, manifest: Any, hashes: list[str], jobs: dict[str, Any]
) -> dict[str, list[Any]]:
    """The followed keys whose job (in ``jobs``, by key hash) ended done with no record served,
    by why: under the verified policy with no verifier running, ``pretune`` said "1/1 done" and
    exited 0, the key missing at run time (a run again said "unserved", exit 1)."""
    from tunecache.client import Client

    wanted = set(hashes)
    unserved: dict[str, list[Any]] = {why: [] for why in UNSERVED}
    with Client(client.url, policy="any") as anyway:
        for key in manifest.keys:
            job = jobs.get(key.digest())
            if key.digest() in wanted and job is not None and job.state == "done" \
                    and not is_tuned(key, client):  # fmt: skip
                unserved[_why_unserved(key, anyway)].append(key)
    return unserved


def say_unserved(unserved: dict[str, list[Any]]) -> int:
    """Prints why each group of keys is not served (a few named); returns how many keys."""
    for why, keys in unserved.items():
        if keys:
            named = ", ".join(shown(k.short()) for k in keys[:3])
            more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
            print(UNSERVED[why].format(keys=named + more), file=sys.stderr)
    return sum(len(keys) for keys in unserved.values())


def last_error(job: Any) -> str:
    """The first line of a job's last error, as a terminal shows it as it is (the error is a
    worker's words, as the server keeps them: control characters escaped, then cut to
    :data:`ERROR_SHOWN` characters), after whose words they are: a worker's report is any
    write token's text, and read as the server's own it named another token as the one to
    revoke (as the dashboard, its reporter's token; nothing for the server's own)."""
    from tunecache.tokens import name_text

    first = shown(job.error.strip().split("\n", 1)[0].strip())
    if not first:
        return "no reason given"
    first = first if len(first) <= ERROR_SHOWN else first[:ERROR_SHOWN] + "..."
    by = getattr(job, "error_by", None)
    if by is None:
        return f"reported by a worker or the server (not recorded): {first}"
    return f"reported by token {name_text(by)}: {first}" if by else first


def why_failed(job: Any) -> str:
    """A failed job's attempts and :func:`last_error`, one line."""
    return f"attempt {job.attempts}/{job.max_attempts}: {last_error(job)}"


def say_failed(jobs: dict[str, Any], hashes: list[str], keys: dict[str, Any]) -> None:
    """Names each followed job that failed, by its key in ``keys`` (by hash: the manifest's,
    not as the server names it), with :func:`why_failed` (at most :data:`FAILED_NAMED`):
    ``pretune`` said "1 failed" and no more, the reason only in the daemon's log and the
    dashboard."""
    failed = [(h, jobs[h]) for h in hashes if h in jobs and jobs[h].state == "failed"]
    for digest, job in failed[:FAILED_NAMED]:
        key = keys[digest] if digest in keys else job.key.to_key()
        print(f"failed: {shown(key.short())}: {why_failed(job)}", file=sys.stderr)
    if len(failed) > FAILED_NAMED:
        print(f"and {counted(len(failed) - FAILED_NAMED, 'more failed job')}: `tunecache "
              "coverage MANIFEST` notes each one's error", file=sys.stderr)  # fmt: skip


# A key tuned (its job done) whose record is not served under the manifest's policy: its job is
# not run again. Tuned under other versions only (stale), or its record waits for a verifier
# (disputed, its uploader's token withdrawn; pending under the verified policy).
UNSERVED = {
    "stale": "tuned under other versions only (stale under the manifest's policy): {keys}; its "
             "job is done, so it is not queued again",
    "unchecked": "tuned, but not served: {keys}: its record waits for a verifier (disputed, or "
                 "pending under the verified policy); `tunecache daemon --verify` decides it",
}  # fmt: skip


def devices_needed(manifest: Any, hashes: list[str]) -> list[str]:
    """The daemons' devices (``cpu``, ``cuda``) the manifest's keys among ``hashes`` need."""
    wanted = set(hashes)
    return sorted({_daemon_device(k) for k in manifest.keys if k.digest() in wanted})


def _daemon_device(key: Any) -> str:
    return "cpu" if key.device.kind == "cpu" else "cuda"


def _archs(manifest: Any, hashes: list[str], device: str) -> list[str]:
    """The archs of the keys among ``hashes`` a daemon of ``device`` runs: a daemon claims its
    own arch's jobs only (the hint said ``--device cpu`` where one ran already, of another)."""
    wanted = set(hashes)
    return sorted({k.device.arch for k in manifest.keys
                   if k.digest() in wanted and _daemon_device(k) == device})  # fmt: skip


def unclaimed_hint(manifest: Any, hashes: list[str]) -> str:
    """What to run when no worker claims the followed jobs: a daemon for each device they need
    (with the packages of the manifest's own kernels), running the kernels' sources as here (a
    daemon's claim names the versions it runs: a job of another version waits for its own)."""
    kernels = f" --kernels {','.join(manifest.packages)}" if manifest.packages else ""
    runs = " and ".join(f"`tunecache daemon --device {device}{kernels}` on a machine of arch "
                        f"{' or '.join(_archs(manifest, hashes, device))}"
                        for device in devices_needed(manifest, hashes))  # fmt: skip
    return (f"no worker has claimed any of these jobs yet: start one with {runs}, with "
            "the kernels' sources as here (a daemon running another version of a kernel leaves "
            "its jobs); waiting (Ctrl-C stops waiting, the jobs stay queued)")  # fmt: skip


def follow(client: Any, hashes: list[str], poll: float = 2.0, *, hint: str = "",
           hint_after: float = UNCLAIMED_HINT_SECONDS,
           started: float | None = None) -> int:  # fmt: skip
    """Prints progress until every followed job is done or failed; returns the failures. The
    elapsed time counts from ``started`` (``time.monotonic()`` when the command began: the
    tuning of ``--local`` included), else from now. When no job was ever claimed
    ``hint_after`` seconds after following began, prints ``hint`` once (and goes on: a daemon
    may start later). On a terminal the line is redrawn at each poll; elsewhere (a log) a line
    is written when a count changes, else every :data:`QUIET_LINE_SECONDS`."""
    from tunecache_cli.progress import Countdown

    wanted = set(hashes)
    following = time.monotonic()  # the hint's clock: a daemon has had no chance before
    started = following if started is None else started
    live = sys.stderr.isatty()
    line = _Line(live)
    countdown, finished, before = Countdown(), 0, None  # before: jobs finished when it began
    worked = None  # when a worker was first seen on one of them: the pace counts from there
    while True:
        jobs = {h: j for h, j in all_jobs(client, hashes).items() if h in wanted}
        states = [j.state for j in jobs.values()]
        done, failed = states.count("done"), states.count("failed")
        running = states.count("running")
        now = time.monotonic()
        elapsed = now - started
        if hint and now - following >= hint_after and all(j.state == "queued" and j.attempts == 0
                                                  for j in jobs.values()):  # fmt: skip
            print(f"{chr(10) if live else ''}{hint}", file=sys.stderr, flush=True)
            hint = ""  # once
        before = done + failed if before is None else before  # not this run's pace
        if worked is None and (running or done + failed > before):  # minutes may pass with no
            worked = now - (0.0 if running else poll)  # worker (no daemon started yet)
        if done + failed != finished and done + failed > before:  # a step: the pace as of now,
            finished = done + failed  # counted down until the next
            countdown.step(now - (worked or started), finished - before, len(wanted) - before,
                           now)  # fmt: skip
        eta = countdown.left(now)
        line.show(f"{done}/{len(wanted)} done, {running} running, {failed} failed", elapsed,
                  "" if eta is None else f", ETA {eta:.0f}s")  # fmt: skip
        if done + failed == len(wanted):
            if live:
                print(file=sys.stderr)
            return failed
        time.sleep(poll)


class _Line:
    """``pretune``'s progress line: redrawn on a terminal; in a log, written when its counts
    change or :data:`QUIET_LINE_SECONDS` after the last (following an hour's jobs wrote 1,800
    lines, one per poll)."""

    def __init__(self, live: bool) -> None:
        self.live, self.counts, self.at = live, "", -QUIET_LINE_SECONDS

    def show(self, counts: str, elapsed: float, eta: str) -> None:
        if not self.live and counts == self.counts and elapsed - self.at < QUIET_LINE_SECONDS:
            return
        self.counts, self.at = counts, elapsed
        print(f"{chr(13) if self.live else ''}{elapsed:6.0f}s {counts}{eta}",
              end="" if self.live else "\n", file=sys.stderr, flush=True)  # fmt: skip


def _tune_here(client: Any, manifest: Any, trials: int, hashes: list[str]) -> None:
    """``pretune --local``: daemons in this process that claim only the manifest's jobs (jobs
    this machine cannot run are left queued; a job someone else queued was tuned here first, at
    its own budget), again while a followed job that failed here waits for its retry. Only the
    devices the jobs' keys need get a daemon (a manifest of CPU keys says nothing of CUDA). A
    job tunes with at most the manifest's largest budget or ``trials`` (the job of a manifest's
    key queued before by someone else may ask for more)."""
    from tunecache_cli.progress import working
    from tuner.daemon import Daemon, DaemonOptions

    skip: set[str] = set()
    most, parts = _most(manifest, trials), _parts(hashes)
    devices = devices_needed(manifest, hashes)

    def drain() -> None:
        for device, part in ((d, p) for d in devices for p in parts):
            if device in skip:
                continue
            options = DaemonOptions(device=device, once=True, trials=trials, max_trials=most,
                                    kernels=manifest.packages, key_hashes=part)  # fmt: skip
            try:
                with working("pretune --local", f"tuning the queued {device} keys here"):
                    Daemon(client, options).run()
            except InvalidInput as exc:  # no GPU, or no backend for it here
                print(f"not tuning {device} jobs here: {exc}", file=sys.stderr)
                skip.add(device)

    _until_no_retry(client, hashes, drain)


def _most(manifest: Any, trials: int) -> int:
    """The most trials a job of ``pretune --local`` or ``--ray`` tunes with: the manifest's
    largest budget, or ``trials`` (the job of a manifest's key that someone else queued before
    may ask for a million)."""
    return max([trials, *(budget for _, budget in manifest.budgets.values())])


def _parts(hashes: list[str]) -> list[tuple[str, ...]]:
    """The followed key hashes in as many claims' filters as they need."""
    from tunecache.jobs import MAX_CLAIM_KEYS

    return [tuple(hashes[i : i + MAX_CLAIM_KEYS]) for i in range(0, len(hashes), MAX_CLAIM_KEYS)]


def _on_ray(client: Any, manifest: Any, trials: int, hashes: list[str], address: str) -> None:
    """``pretune --ray``: daemons as Ray tasks that claim only the manifest's jobs, again while
    a failed job waits for its retry."""
    from tuner.fanout import drain_on_ray

    def drain() -> None:
        for part in _parts(hashes):
            stored = drain_on_ray(client.url, Settings.from_env(with_url=False).token,
                                  address=None if address == "local" else address, trials=trials,
                                  kernels=manifest.packages, key_hashes=part,
                                  max_trials=_most(manifest, trials))  # fmt: skip
            print(f"ray tasks stored {len(stored)} records", file=sys.stderr)

    _until_no_retry(client, hashes, drain)


def _until_no_retry(client: Any, hashes: list[str], drain: Any) -> None:
    """Runs ``drain`` (daemons that stop when nothing is claimable), then again when a followed
    job that failed is due for its retry (the server's delay), or once the lease of one leased
    elsewhere lapses: a run stopped with Ctrl-C left its job leased for minutes, and the next run
    said "1 running" until it was killed.

    Either is drained for at its time (:data:`LAPSE_MARGIN` after, by this machine's clock) and
    again :data:`MAX_LEASE_WAIT` after: a job still leased or queued then is one no daemon here
    takes (its device is not here), left to :func:`follow`, not drained for every few seconds
    (a failed GPU job's retries drained a CPU machine's daemons every 2 s, with ``--ray`` a
    cluster's tasks, until it ran out of attempts elsewhere). Once was not enough: a server
    whose clock lags this machine's by more than the margin still held it at the first drain."""
    from tunecache_cli.progress import working

    # per job and its time (a new retry time is a new wait): drains since it was due
    wanted, due, tried, drained = set(hashes), True, dict[tuple[int, float], int](), 0.0
    while True:
        if due:
            drained = time.time()
            drain()
        jobs = [j for h, j in all_jobs(client, hashes).items() if h in wanted]
        # a queued job's lease_expires_at is when its retry is due (none: since it failed)
        retries = {(j.id, (j.lease_expires_at or j.updated_at).timestamp()) for j in jobs
                   if j.state == "queued" and j.attempts > 0}  # fmt: skip
        leases = {(j.id, j.lease_expires_at.timestamp()) for j in jobs
                  if j.state == "running" and j.lease_expires_at is not None}  # fmt: skip
        waiting = retries | leases
        if due:
            for w in waiting:
                if w[1] + LAPSE_MARGIN <= drained:
                    tried[w] = tried.get(w, 0) + 1
        # drained for twice since it was due, the last well past it, and not taken: none here
        # takes it (a daemon that stopped early, a --once one handed a job again, drained once)
        left = {w for w in waiting if tried.get(w, 0) < 2 or w[1] + MAX_LEASE_WAIT > drained}
        now = time.time()
        # when each is drained for next: at its time, then once more well past it
        nexts = {w: w[1] + (MAX_LEASE_WAIT if tried.get(w, 0) else LAPSE_MARGIN) for w in left}
        if not nexts:
            return
        upcoming = min(nexts.values())
        wait = min(MAX_LEASE_WAIT, max(RETRY_POLL_SECONDS, upcoming - now))
        due = upcoming <= now + wait  # else read again then: a worker renews its lease
        first = time.strftime("%H:%M:%S", time.localtime(min(w[1] for w in nexts)))
        if any(w in retries for w in nexts):
            said = f"failed jobs wait for their retry (the first at {first})"
        else:
            said = (f"{counted(len(nexts), 'job')} leased elsewhere: tuned here if a worker's "
                    f"lease lapses (the first at {first})")  # fmt: skip
        with working("pretune", said):
            time.sleep(wait)


def _check_strategies(manifest: Any) -> None:
    """Every entry's strategy can tune its backend, or nothing is queued (a backend not
    installed here is left to the daemon that tunes it).

    Raises:
        InvalidInput: naming the first key whose strategy cannot.
    """
    from backends import get_backend
    from tuner.tune import strategy_problem

    backends: dict[str, Any] = {}
    for key in manifest.keys:
        strategy = manifest.budgets[key.digest()][0]
        if strategy is None:
            continue
        if key.backend not in backends:
            try:
                backends[key.backend] = get_backend(key.backend)
            except Exception:  # not importable here (no TVM, no Triton): the daemon will say
                backends[key.backend] = None
        backend = backends[key.backend]
        if backend is not None and (why := strategy_problem(backend, strategy)) is not None:
            raise InvalidInput(f"{key.short()}: {why}; nothing queued")


def run(args: argparse.Namespace) -> int:
    from tunecache.client import Client
    from tunecache.manifest import load_manifest
    from tunecache_cli.interrupt import prompt

    started = time.monotonic()  # the progress line's clock: --local's tuning counts
    check_trials("--trials", args.trials)
    manifest = load_manifest(args.manifest)  # a bad manifest stops here: nothing queued
    if args.cancel:
        from tunecache_cli.pretune_cancel import cancel

        if args.json or args.no_wait:
            raise InvalidInput("--cancel queues and follows nothing: no --json or --no-wait")
        preflight(server_url(args), "write", "cancelling jobs")
        with Client(server_url(args)) as client:
            return cancel(client, manifest)
    _check_strategies(manifest)
    preflight(server_url(args), "write", "queuing jobs")
    with Client(server_url(args), policy=manifest.policy) as client:
        hashes, tuned, unserved = queue(client, manifest)
        left = sum(len(keys) for keys in unserved.values())
        print(f"{counted(len(manifest.keys), 'key')}: {tuned} tuned already, "
              f"{len(hashes)} queued{f', {left} unserved' if left else ''}",
              file=sys.stderr)  # fmt: skip
        say_unserved(unserved)
        with prompt():  # Ctrl-C while tuning here: ended within a second (it took 8.5 s)
            if args.local and hashes:
                _tune_here(client, manifest, args.trials, hashes)
            if args.ray and hashes:
                _on_ray(client, manifest, args.trials, hashes, args.ray)
        failed, jobs = 0, None
        if hashes and not args.no_wait:
            failed = follow(client, hashes, hint=unclaimed_hint(manifest, hashes),
                            started=started)  # fmt: skip
            jobs = all_jobs(client, hashes)  # as they ended: the failed named, the unserved found
            say_failed(jobs, hashes, {key.digest(): key for key in manifest.keys})
            left += say_unserved(unserved_after(client, manifest, hashes, jobs))
        if args.json:  # stdout holds the JSON only; progress went to stderr
            jobs = all_jobs(client, hashes) if jobs is None else jobs
            print(_followed_json(jobs, hashes, len(manifest.keys), tuned))
        return 1 if failed or left else 0


def _followed_json(jobs: dict[str, Any], hashes: list[str], keys: int, tuned: int) -> str:
    """``--json``: the manifest's counts and each followed job as it stands."""
    import json

    followed = [jobs[h].model_dump(mode="json", by_alias=True) for h in hashes if h in jobs]
    return json.dumps({"keys": keys, "tuned_already": tuned, "jobs": followed}, indent=2)
