"""The tuning daemon: claims jobs this machine can run, tunes them, uploads the winners.

One daemon per device (each GPU; CPU daemons take TVM-llvm and Inductor-CPU jobs). A claim names
the device's arch and the backends installed here, so the server only hands out jobs that fit. A
job's key is completed with this machine's device and environment (a miss seen on another device
of the arch is tuned here), tuned with :func:`tuner.tune` through one harness kept for every job,
uploaded, and the job completed with the record id — or failed with the reason, to be retried until
its attempts run out. While it tunes, a thread renews the lease; a daemon that dies leaves the job
to expire and be claimed again, one interrupted mid-tune gives it back. :meth:`Daemon.stop` (the
CLI's SIGTERM) lets the current job finish.

Example:
    >>> with Client(url) as client:  # doctest: +SKIP
    ...     Daemon(client, DaemonOptions(once=True)).run()
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import secrets
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, TypeVar

from backends import Budget, get_backend
from tunecache.client import Client
from tunecache.configcheck import as_run
from tunecache.device import local_device
from tunecache.errors import InvalidInput, ServerError, SourcesChanged, TuningError, one_line
from tunecache.jobs import MAX_CLAIM_SOURCES, MAX_JOB_PAGE, JobPublic
from tunecache.kernels import BACKENDS, get_kernel
from tunecache.key import DEVICE_KINDS, Key, kernel_module, key_for
from tunecache.outbox import Later
from tunecache.pages import fetch_first
from tuner.handed import unasked
from tuner.harness import Harness
from tuner.kernel_versions import builtin_versions, changed_on_disk, importable
from tuner.polling import Ended, ended, leased, passing, poll, release
from tuner.tune import TuneOptions, tune

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class DaemonOptions:
    """How a daemon works: its device, backends, budget, lease and polling.

    Attributes:
        device: ``"cpu"`` or ``"cuda"`` (device 0; set ``CUDA_VISIBLE_DEVICES`` per daemon).
        backends: the backends to take jobs for; default: those installed that run on
            ``device`` (Triton only on a GPU: its interpreter cannot time).
        once: stop when no job is left, instead of polling; and when a job this run ran is
            handed out again with no attempt spent on it, after this run completed it, or for a
            fourth run (:meth:`Daemon.handed_again`): it is not run, and its lease lapses.
        kernels: the packages of users' kernels this daemon may import (a job names its kernel
            ``package.module:Class``, and anyone who can report a miss can queue a job); it
            claims no job for another package's kernel. Default: built-in kernels only.
        trials: a job's search budget when it names none.
        max_trials, job_seconds: what one job may spend at most, whatever it asks (a write
            token queued a job of 1,000,000 trials: the daemon tuned it for hours, a stop
            request waiting on it); ``trials`` if more.
        key_hashes: claim only jobs for these keys (``pretune --local``: its manifest's, not
            what anyone else queued); default: any.
    """

    device: str = "cpu"
    backends: tuple[str, ...] | None = None
    trials: int = 32
    max_trials: int = 1024
    job_seconds: float = 3600.0
    strategy: str | None = None
    lease_seconds: float = 300.0
    poll_seconds: float = 5.0
    once: bool = False
    workers: int | None = None
    kernels: tuple[str, ...] = ()
    key_hashes: tuple[str, ...] | None = None


def runnable_backends(device: str, wanted: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The backends installed here whose kernels run on ``device`` (of ``wanted``, if given)."""
    chosen = []
    for name in wanted or BACKENDS:
        if DEVICE_KINDS.get(name) != device:
            continue
        backend = get_backend(name)
        reason = backend.unavailable_reason() or backend.measures_meaningfully()
        if reason is None:
            chosen.append(name)
        else:
            logger.info("not taking %s jobs: %s", name, reason)
    return tuple(chosen)


MAX_RUNS_ONCE = 3  # runs of one job a --once worker makes (a failed job's retries)
# Jobs in a row failing as nothing foresaw after which the daemon stops: a fault of its own (a
# broken install) failed every job it claimed, each spending an attempt.
MAX_INTERNAL_ERRORS = 3


class Worker:
    """What the tuning daemon and the verifier share: a name, this machine's device of a kind
    and the backends installed here that run on it, and a stop flag (:meth:`stop`: finish the
    current job, then stop)."""

    def __init__(self, client: Client, device: str, backends: tuple[str, ...] | None,
                 role: str = "", kernels: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.client = client
        self.kernels = importable(kernels)
        # Unique per process: a worker that claims while it holds a lease is handed that job
        # again, and containers on one host network share its name and often a pid.
        self.worker = f"{platform.node()}:{os.getpid()}:{secrets.token_hex(3)}{role}"
        try:
            self.device = local_device(device)
        except InvalidInput:
            raise InvalidInput(f"no {device} device is visible here (CUDA_VISIBLE_DEVICES?): "
                               f"nothing to take {device} jobs") from None  # fmt: skip
        self.backends = runnable_backends(device, backends)
        self.asked = backends  # what --backends named (None: every backend)
        self.stopping = threading.Event()

    def stop(self) -> None:
        """Finish the current job, then stop."""
        self.stopping.set()

    def refused(self, kernel: str) -> str | None:
        """Why this worker will not import ``kernel`` (named by the server, so by anyone who can
        queue a job or upload a record), or ``None``: a built-in kernel, or one of a package the
        operator allowed (``--kernels``)."""
        module = kernel_module(kernel)
        if module is None:
            return None
        if any(p.startswith("__") and p.endswith("__") for p in module.split(".")):
            return (f"kernel {kernel!r} is in {module!r}: a worker imports no module named "
                    "like __main__ (a package's command line, run at import)")  # fmt: skip
        if any(module == p or module.startswith(f"{p}.") for p in self.kernels):
            return None
        allowed = ", ".join(self.kernels) or "none: built-in kernels only"
        return (f"kernel {kernel!r} is not in a package this worker imports (--kernels: "
                f"{allowed})")  # fmt: skip

    def arch(self) -> str:
        """This device's arch, what claims name.

        Raises:
            InvalidInput: no backend installed here runs on this device.
        """
        if not self.backends and self.asked is not None:  # --backends named only others
            runs = runnable_backends(self.device.kind, None)
            raise InvalidInput(f"--backends {','.join(self.asked)}: none of them runs on "
                               f"{self.device.kind} here (those that do: "
                               f"{', '.join(runs) or 'none'})")  # fmt: skip
        if not self.backends:
            raise InvalidInput(f"no backend installed here runs on {self.device.kind}")
        return self.device.fingerprint.arch


SAID_KERNELS = 5  # kernels the daemon's hint names at most (Daemon.say_others)
REJECTED_PAGES = 10  # of 100 records: the configs rejected at a key a re-tune leaves out
# Bytes of answers a job's listing of one status may read: 1,000 records without their trials
# take a few MB, where a server sending each with thousands of trials held a daemon at 3.8 GB
# (2 GiB read) before its job was tuned.
REJECTED_BYTES = 16 * 2**20


class Daemon(Worker):
    """Claims, tunes, uploads and completes jobs until stopped (or, ``once``, out of jobs)."""

    def __init__(self, client: Client, options: DaemonOptions) -> None:
        super().__init__(client, options.device, options.backends, kernels=options.kernels)
        self.options = options
        self.done: list[int] = []  # record ids stored, in order
        self.failed: list[int] = []  # job ids given back as failed
        self.stopped: list[int] = []  # job ids whose tune stopped: cancelled meanwhile
        # job id -> (its attempts when last claimed, runs, what this run did with it): --once
        self.seen: dict[int, tuple[int, int, str]] = {}
        self.unsent: list[tuple[JobPublic, Later, float]] = []  # tuned while the server was down
        self.internal_errors = 0  # jobs in a row that failed as nothing foresaw
        self.others_said = False  # say_others, once
        # (kernel, backend) -> its source hash here, what claims name: built-in kernels on
        # this daemon's backends, then each user's kernel as its first job imports it.
        self.versions: dict[tuple[str, str], str] = builtin_versions(self.backends)

    def run(self) -> int:
        """Works until stopped; returns how many jobs it completed. A record the server did not
        take as it answered no one waits in the outbox, sent (and its job completed) before the
        next claim; one still unsent when the daemon stops waits for ``tunecache push``."""
        arch = self.arch()
        logger.info("%s: taking %s jobs for %s", self.worker, ",".join(self.backends), arch)
        try:
            with Harness(workers=self.options.workers) as harness:
                poll(lambda: self.claim(arch), lambda job: self.work(job, harness),
                     stopping=self.stopping, once=self.options.once,
                     every=self.options.poll_seconds,
                     give_back=lambda job: release(self.client, job, self.worker))  # fmt: skip
        finally:
            for _, kept, _ in self.unsent:
                kept.lost()
        return len(self.done)

    def claim(self, arch: str) -> JobPublic | None:
        """The next job for this device, once the records tuned while the server did not answer
        are sent; the first time none is left, :meth:`say_others`.

        Raises:
            SourcesChanged: a kernel's sources changed on disk since this daemon read them
                (:func:`tuner.kernel_versions.changed_on_disk`): it stops, claiming nothing
                (the records tuned before are sent; a job tuned as they changed was failed).
        """
        self.send_unsent()
        if (why := changed_on_disk(self.versions)) is not None:
            raise SourcesChanged(why)
        job = self.client.claim_job(self.worker, lease_seconds=self.options.lease_seconds,
                                    device_arch=arch, backends=self.backends,
                                    kernel_packages=self.kernels,
                                    key_hashes=self.options.key_hashes,
                                    sources=[(k, b, h) for (k, b), h in self.versions.items()
                                             ][:MAX_CLAIM_SOURCES])  # fmt: skip
        if job is None and not self.others_said and self.options.key_hashes is None:
            self.others_said = True  # (pretune --local tunes its manifest's keys: not said)
            self.say_others(arch)
        return job

    def say_others(self, arch: str) -> None:
        """Says once which queued jobs of this device wait for kernels of packages this worker
        does not import (a team's own kernel, queued by ``pretune``: a daemon without
        ``--kernels`` idled beside it, saying "0 jobs completed"), among the first
        :data:`MAX_JOB_PAGE`, and which wait for another version of a kernel than it runs (an
        upgrade half rolled out). A hint: a server that cannot list them says nothing."""
        try:
            queued = self.client.list_jobs(state="queued", limit=MAX_JOB_PAGE).items
        except ServerError:
            return
        versions = sorted(
            {
                j.key.kernel
                for j in queued
                if j.key.device.arch == arch
                and self.versions.get((j.key.kernel, j.key.backend), j.key.source_hash)
                != j.key.source_hash
            }
        )
        if versions:
            logger.warning("queued jobs for %s of %s are for another version of the kernel "
                           "than this worker runs (its sources hash otherwise here): they wait "
                           "for a worker of their version", arch,
                           ", ".join(versions[:SAID_KERNELS]))  # fmt: skip
        kernels = sorted({j.key.kernel for j in queued if j.key.device.arch == arch
                          and j.key.backend in self.backends
                          and self.refused(j.key.kernel) is not None})  # fmt: skip
        # Names anyone who may report a miss chooses: only those a --kernels could take (no
        # module like __main__ in its path, no standard library's), five at most.
        parts = {k: str(kernel_module(k)).split(".") for k in kernels}
        kernels = [
            k
            for k in kernels
            if parts[k][0] not in sys.stdlib_module_names
            and not any(p.startswith("__") and p.endswith("__") for p in parts[k])
        ]
        kernels = kernels[:SAID_KERNELS]
        if kernels:
            logger.warning("queued jobs for %s wait for kernels this worker does not import, "
                           "such as %s; --kernels %s takes them, for packages you trust (a "
                           "worker imports each, running its code)", arch, ", ".join(kernels),
                           ",".join(sorted({parts[k][0] for k in kernels})))  # fmt: skip

    def send_unsent(self) -> None:
        """Sends the records tuned while the server did not answer, and completes their jobs
        (a record the server has already is answered as stored: sending it again is safe).

        Raises:
            ServerError: the server still does not answer (the rest wait), or it refused this
                token the upload (403: its quota of stored bytes is full): every job it tuned
                would be refused alike, so it claims no more (the record waits for a push).
        """
        while self.unsent:
            job, kept, started = self.unsent[0]
            try:
                stored = kept.send(self.client)
            except ServerError as exc:
                if passing(exc):
                    raise
                kept.lost()  # refused as invalid: set aside already; else it waits for a push
                self.give_back(job, exc)
                self.unsent.pop(0)
                if exc.status_code == 403:
                    raise
                continue
            self.finish(job, stored.record_id, started)
            self.unsent.pop(0)

    def local_key(self, job: JobPublic) -> Key:
        """The job's key completed with this machine's device and environment.

        Raises:
            InvalidInput: the kernel's source hashes otherwise here: a record of it would be
                served to none of the processes that asked (the job was done, and their misses
                found it so).
        """
        wanted = job.key
        # Its version here, claimed from now on (known before the key is checked: another
        # version's job may name a dtype or shape this one does not take)
        here = get_kernel(wanted.kernel).source_hash(wanted.backend)
        self.versions[(wanted.kernel, wanted.backend)] = here
        if here != wanted.source_hash:
            raise InvalidInput(
                f"{wanted.kernel}'s source hashes {here} here, the job's "
                f"{wanted.source_hash}: another version of the kernel (or of tunecache, for a "
                "built-in) asked, and a record of this one would not be served to it"
            )
        return key_for(wanted.kernel, wanted.backend, wanted.problem, wanted.dtype,
                       device=self.device)  # fmt: skip

    def rejected_at(self, job: JobPublic, key: Key) -> tuple[dict[str, Any], ...]:
        """The configs a verifier of the cache rejected at ``key``, or disputed there, each once
        (the first :data:`REJECTED_PAGES` hundred records of each status, in at most as many
        requests each: copies of one config do not crowd out another): the re-tune of a key whose
        record was rejected leaves them out, since a new upload of one is stored disputed,
        out of service, and answers no job (a 409: an attempt spent on each finding it again, a
        write token's own disputed upload of the key's best config failing the job). Those read
        before the server stopped answering, if it did: the tune goes on."""
        refused: dict[str | None, dict[str, Any]] = {}  # by the config as it runs
        for status in ("rejected", "disputed"):
            try:
                listed = fetch_first(self.client, REJECTED_PAGES * 100, requests=REJECTED_PAGES,
                                     page=100, max_bytes=REJECTED_BYTES, key_hash=key.digest(),
                                     status=status)  # fmt: skip
            except ServerError as exc:  # those read so far are still left out
                logger.warning("job %d: the configs %s at its key are unknown (%s)", job.id,
                               status, exc)  # fmt: skip
                break
            for record in listed.items:
                if record.status == status:
                    runs = as_run(key.backend, record.config, kernel=key.kernel)
                    refused.setdefault(runs, dict(record.config))
        if refused:
            logger.info("job %d: leaving out %d config(s) rejected or disputed at its key",
                        job.id, len(refused))  # fmt: skip
        return tuple(refused.values())

    def work(self, job: JobPublic, harness: Harness) -> bool:
        """Tunes one claimed job, uploads the winner and completes it (or fails it, saying why:
        then ``False``)."""
        if self.options.once and (why := self.handed_again(job)) is not None:
            logger.warning("job %d: handed out again after this --once worker %s: not running "
                           "it, not claiming any more", job.id, why)  # fmt: skip
            self.stop()  # its lease lapses: another worker, or a later run, takes it
            return True
        runs = self.seen.get(job.id, (0, 0, ""))[1]
        self.seen[job.id] = (job.attempts, runs + 1, "ran it")
        started = time.perf_counter()
        logger.info("job %d: claimed %s (attempt %d of %d)", job.id, job.key.to_key().short(),
                    job.attempts, job.max_attempts)  # fmt: skip
        tuning = False  # only a tune asks the workers (bad input is refused before it does)
        try:
            asked = self.arch(), self.backends, self.options.key_hashes  # a server may not
            if (why := self.refused(job.key.kernel) or unasked(job, *asked)) is not None:
                raise InvalidInput(why)
            key = self.local_key(job)
            budget, options = self.plan(job, key)
            with leased(self.client, job, self.worker, self.options.lease_seconds) as lease:
                tuning = True
                outcome = tune(key, budget, options, harness=harness, progress=lease.check)
            if (why := changed_on_disk(self.versions)) is not None:  # a pull meanwhile: the
                raise SourcesChanged(why)  # harness may have tuned the new code (the claim stops)
        except Ended as exc:  # cancelled meanwhile: nothing it finds would answer the job
            logger.warning("job %d: tune stopped: %s", job.id, exc)
            self.stopped.append(job.id)
            self._did(job, f"stopped its tune ({exc})")
            harness.restart(busy_only=True)
            return True
        except (InvalidInput, TuningError, ServerError) as exc:
            self.give_back(job, exc)
            if tuning and not isinstance(exc, InvalidInput):
                harness.restart(busy_only=True)  # an answer left unread is not the next job's
            return False
        except Exception as exc:  # a bug, or a kernel's code failing as nothing foresaw: a job
            # that ended the daemon ended each that claimed it next, its lease lapsing to them
            logger.error("job %d: unexpected error", job.id, exc_info=True)
            self.give_back(job, TuningError(f"internal error: {one_line(exc)}"))
            self.internal_errors += 1
            if self.internal_errors >= MAX_INTERNAL_ERRORS:
                raise  # the daemon's own fault, not the jobs': it stops
            if tuning:
                harness.restart()
            return False
        self.internal_errors = 0
        # Kept in the outbox until the server has it; sent, and its job completed, now or
        # (the server not answering) before the next claim.
        self.unsent.append((job, Later(self.client.url, outcome.record, f"job {job.id}'s record"),
                            started))  # fmt: skip
        try:
            self.send_unsent()
        except ServerError as exc:
            if not passing(exc):
                raise  # the token may store no more: tuning on would be refused alike
            logger.warning("job %d: tuned, but the server does not answer (%s): the record "
                           "waits, sent before the next claim", job.id, exc)  # fmt: skip
        return True

    def plan(self, job: JobPublic, key: Key) -> tuple[Budget, TuneOptions]:
        """How ``job`` is tuned: its strategy and trials, else this daemon's (at most its
        ``max_trials``), within ``job_seconds``; the configs rejected at ``key`` left out."""
        most = max(self.options.max_trials, self.options.trials)
        budget = Budget(trials=min(job.trials or self.options.trials, most),
                        seconds=self.options.job_seconds)  # fmt: skip
        options = TuneOptions(strategy=job.strategy or self.options.strategy,
                              workers=self.options.workers,
                              refused=self.rejected_at(job, key))  # fmt: skip
        return budget, options

    def handed_again(self, job: JobPublic) -> str | None:
        """``once``: why ``job``, claimed before in this run, is not run again (``None``: it may
        be: a failed job's retry, an attempt later). A server that handed out one job on every
        claim (its retry due at once, its completion or failure refused) kept a --once worker
        failing it 28 times in 120 s, or tuning and uploading it each time; an honest server
        spends an attempt on every claim, and retries a job a few times at most."""
        if job.id not in self.seen:
            return None
        attempts, runs, did = self.seen[job.id]
        if did.startswith("completed") or did.startswith("stored"):
            return did
        if job.attempts <= attempts:
            return f"{did} (claimed again at attempt {job.attempts}, no attempt spent)"
        if runs >= MAX_RUNS_ONCE:
            return f"{did} {runs} times"
        return None

    def _did(self, job: JobPublic, what: str) -> None:
        """Notes what this run did with ``job`` (:meth:`handed_again`), its first ending kept."""
        attempts, runs, did = self.seen.get(job.id, (job.attempts, 1, "ran it"))
        self.seen[job.id] = (attempts, runs, what if did == "ran it" else did)

    def give_back(self, job: JobPublic, exc: Exception) -> None:
        """Fails ``job``, saying why (to be retried while it has attempts left)."""
        logger.warning("job %d: failed: %s", job.id, exc)
        self.failed.append(job.id)
        self._did(job, f"failed it ({type(exc).__name__}: {exc})")
        with contextlib.suppress(ServerError):
            self.client.fail_job(job.id, self.worker, f"{type(exc).__name__}: {exc}")

    def finish(self, job: JobPublic, record_id: int, started: float) -> None:
        """Completes ``job`` with its stored record; refused (the lease lost, a record that
        answers no job), the job is given back, an attempt spent: kept, its next claim would be
        this job again, for good.

        Raises:
            ServerError: the server did not answer (the record is sent again, and answered as
                stored, before the job is completed).
        """
        try:
            self.client.complete_job(job.id, self.worker, record_id)
        except ServerError as exc:
            if passing(exc):
                raise
            logger.warning("job %d: record #%d stored, job not completed: %s", job.id,
                           record_id, exc)  # fmt: skip
            self._did(job, f"stored record #{record_id} for it, its completion refused ({exc})")
            if exc.status_code != 409 or ended(self.client, job.id) is None:  # not cancelled,
                self.give_back(job, exc)  # nor answered meanwhile: failed, as it had not ended
            return
        self.done.append(record_id)
        self._did(job, f"completed it with record #{record_id}")
        logger.info("job %d: stored record #%d in %.1f s", job.id, record_id,
                    time.perf_counter() - started)  # fmt: skip
