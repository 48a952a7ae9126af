"""``tunecache daemon``: claim the tuning jobs this machine can run, tune them, upload them.

With ``--verify`` (a token with the ``verify`` scope) it verifies instead: it claims uploaded
records of this machine's arch, re-validates and re-times them here (:mod:`tuner.verify`), and
the server serves them as verified or rejects them.

SIGTERM: the current job is finished, then the daemon stops; Ctrl-C, or a second SIGTERM: it
stops at once, the job it was tuning given back (queued again, its attempt refunded). Exit 0
when stopped (or, ``--once``, out of jobs), 2 bad input, 3 server unreachable.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from typing import Any

from tunecache.errors import InvalidInput
from tunecache.kernels import BACKENDS
from tunecache_cli.args import (
    add_server,
    check_seconds,
    check_trials,
    check_workers,
    parse_backends,
    preflight,
    server_url,
)

# A lease is renewed three times in its length for the whole tune (a review counted 13,451
# renewals in a second at --lease 1e-300, with a stub client), and an empty claim is asked again
# after --poll: below these, a daemon floods its server with requests.
MIN_LEASE_SECONDS = 1.0
MIN_POLL_SECONDS = 0.1


def register(commands: Any) -> None:
    parser = commands.add_parser("daemon", help="tune the server's queued jobs on this machine")
    device_help = "the device to tune for (cuda: device 0; one daemon per GPU)"
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help=device_help)
    backends_help = f"comma-separated, of {', '.join(BACKENDS)} (default: those installed here)"
    parser.add_argument("--backends", help=backends_help)
    parser.add_argument("--trials", type=int, default=32,
                        help="search budget of a job that names none")  # fmt: skip
    parser.add_argument("--max-trials", type=int, default=1024,
                        help="the most trials one job may search, whatever it asks")  # fmt: skip
    parser.add_argument(
        "--job-seconds",
        type=float,
        default=3600.0,
        help="the most seconds one job may take: search, checks, timing",
    )
    parser.add_argument("--strategy", help="search strategy (default: the backend's)")
    parser.add_argument(
        "--once", action="store_true",
        help="stop when no job is left (or when the server hands out again a job this run "
        "completed, or one it ran with no attempt spent since)",
    )  # fmt: skip
    parser.add_argument("--poll", type=float, default=5.0, help="seconds between empty claims")
    parser.add_argument("--lease", type=float, default=300.0, help="job lease in seconds")
    parser.add_argument("--workers", type=int, help="measurement worker processes")
    parser.add_argument(
        "--kernels", metavar="PKG,…",
        help="packages of your own kernels it may import (jobs and records name kernels as "
        "package.module:Class; default: built-in kernels only)",
    )  # fmt: skip
    parser.add_argument(
        "--verify", action="store_true",
        help="verify uploaded records instead of tuning jobs (a token with the verify scope)",
    )  # fmt: skip
    add_server(parser)
    parser.set_defaults(run=run, log_times=True)  # its log runs for days: each line's time


def _packages(text: str | None) -> tuple[str, ...]:
    """``--kernels``: package names, each found here (before anything asks the server)."""
    from tuner.kernel_versions import importable

    if text is None:
        return ()
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise InvalidInput(f"--kernels {text!r}: expected package names, comma-separated")
    try:
        return importable(names)
    except InvalidInput as exc:
        raise InvalidInput(f"--kernels: {exc}") from None


def _check_strategy(strategy: str | None, device: str, backends: tuple[str, ...] | None) -> None:
    """Raises:
    InvalidInput: ``--strategy`` cannot tune one of the backends the daemon takes jobs of (a
    typo was said only by the first job claimed: failed, an attempt of a team's job spent)."""
    if strategy is None:
        return
    from backends import get_backend
    from tuner.daemon import runnable_backends
    from tuner.tune import strategy_problem

    names = runnable_backends(device, backends)
    problems = {name: strategy_problem(get_backend(name), strategy) for name in names}
    fits = [name for name, why in problems.items() if why is None]
    for why in filter(None, problems.values()):
        hint = f" (--backends {','.join(fits)}: those it can tune)" if fits else ""
        raise InvalidInput(f"--strategy: {why}{hint}")


def _check_device(kind: str) -> None:
    """Raises:
    InvalidInput: ``--device cuda`` where no GPU is visible, saying what to run instead."""
    from tunecache.device import local_device

    try:
        local_device(kind)
    except InvalidInput:
        raise InvalidInput(
            f"--device {kind}: no CUDA device is visible here (CUDA_VISIBLE_DEVICES"
            "?); on a CPU machine, run a CPU daemon (--device cpu)"
        ) from None


def run(args: argparse.Namespace) -> int:
    from tunecache.client import Client
    from tunecache.schemas import MAX_LEASE_SECONDS, MAX_SEARCH_SECONDS
    from tuner.daemon import Daemon, DaemonOptions
    from tuner.tune import default_workdir

    check_trials("--trials", args.trials)
    check_trials("--max-trials", args.max_trials)
    check_seconds("--job-seconds", args.job_seconds, most=MAX_SEARCH_SECONDS)
    check_workers(args.workers)
    check_seconds("--poll", args.poll, least=MIN_POLL_SECONDS)
    check_seconds("--lease", args.lease, most=MAX_LEASE_SECONDS, least=MIN_LEASE_SECONDS)
    _check_device(args.device)
    kernels = _packages(args.kernels)  # these, before the server
    backends = None if args.backends is None else parse_backends(args.backends)
    if args.verify:  # re-times configs: no search, no work folder
        return run_verifier(args, kernels, backends)
    _check_strategy(args.strategy, args.device, backends)
    default_workdir()  # an unusable TUNECACHE_WORK_DIR refuses the start, not each job it claims
    preflight(server_url(args), "write", "the daemon (it claims jobs and uploads)")
    options = DaemonOptions(
        device=args.device, backends=backends, trials=args.trials, strategy=args.strategy,
        lease_seconds=args.lease, poll_seconds=args.poll, once=args.once, workers=args.workers,
        kernels=kernels, max_trials=args.max_trials, job_seconds=args.job_seconds,
    )  # fmt: skip
    logging.getLogger("tuner.daemon").setLevel(logging.INFO)  # what it claimed, stored, failed
    with Client(server_url(args)) as client:
        daemon = Daemon(client, options)
        _until_stopped(daemon)
    done = len(daemon.done)
    stopped = f", {len(daemon.stopped)} stopped (ended on the server)" if daemon.stopped else ""
    print(f"daemon {daemon.worker}: {done} job{'' if done == 1 else 's'} completed, "
          f"{len(daemon.failed)} failed{stopped}", file=sys.stderr)  # fmt: skip
    return 1 if args.once and daemon.failed else 0  # --once: a script can tell it went wrong


def _say(line: bytes) -> None:
    """Writes ``line`` to stderr from a signal handler: unbuffered (a print or a log line there,
    the main thread being in one, raised), and only to the stderr Python has (with none, the
    descriptor 2 may be another file's now: a worker's pipe)."""
    if sys.stderr is None:
        return
    with contextlib.suppress(OSError, ValueError):  # closed, full, gone: nothing to tell
        os.write(sys.stderr.fileno(), line + b"\n")


def _until_stopped(worker: Any) -> None:
    """Runs a daemon or a verifier until it is done. SIGTERM lets the current job or record
    finish, then stops it; a second SIGTERM, or Ctrl-C, stops it at once, what it was working
    on given back (:func:`tuner.polling.release`: a service manager's stop sends SIGTERM, and
    kills what outlives its wait, the job left to its lease). Where Ctrl-C is ignored (a
    background job of a script), a second SIGTERM says it cannot: raised inside a TVM search,
    which stops at Ctrl-C by a handler of its own, a ``KeyboardInterrupt`` crashed the process.
    """

    def terminate(signum: int, frame: Any) -> None:
        interrupt = signal.getsignal(signal.SIGINT)  # Python's, or a TVM search's: it stops
        now = callable(interrupt)
        if not worker.stopping.is_set():
            worker.stop()
            _say(b"tunecache: SIGTERM: stopping once the current work is done"
                 + (b" (a second SIGTERM, or Ctrl-C: now, given back)" if now else
                    b" (Ctrl-C is ignored here: no sooner)"))  # fmt: skip
        elif callable(interrupt):
            interrupt(signal.SIGINT, frame)  # as Ctrl-C
        else:
            _say(b"tunecache: SIGTERM again: Ctrl-C is ignored here (a background job of a "
                 b"script?), so it cannot stop at once: the current work ends first")  # fmt: skip

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        worker.run()
    except KeyboardInterrupt:
        worker.stop()
    finally:  # stopped: a SIGTERM now ends the process (its handler raised past this try)
        signal.signal(signal.SIGTERM, previous)


def run_verifier(args: argparse.Namespace, kernels: tuple[str, ...],
                 backends: tuple[str, ...] | None) -> int:  # fmt: skip
    """``daemon --verify``: re-check uploaded records until stopped (or, ``--once``, done)."""
    from tunecache.client import Client
    from tuner.verify import Verifier, VerifierOptions

    preflight(server_url(args), "verify", "the verifier (it marks records verified or rejected)")
    options = VerifierOptions(device=args.device, backends=backends, lease_seconds=args.lease,
                              poll_seconds=args.poll, once=args.once, workers=args.workers,
                              kernels=kernels)  # fmt: skip
    logging.getLogger("tuner.verify").setLevel(logging.INFO)
    with Client(server_url(args)) as client:
        verifier = Verifier(client, options)
        _until_stopped(verifier)
    outcomes = list(verifier.outcomes.values())
    passed, failed = outcomes.count("passed"), outcomes.count("failed")
    decided = passed + failed
    print(f"verifier {verifier.worker}: {decided} record{'' if decided == 1 else 's'} decided "
          f"({passed} verified, {failed} rejected), {outcomes.count('unverifiable')} given back "
          "as unverifiable", file=sys.stderr)  # fmt: skip
    return 0
