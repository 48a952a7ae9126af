"""One client per process and settings, shared by every decorated kernel and thread, and the
environment's settings read once (a malformed variable taken as unset, with a warning). A child
forked after the client was made keeps the object, renewed (its own connections and background
thread, :mod:`tunecache.forksafe`).

A malformed ``TUNECACHE_URL`` is no server at all, never the default one (someone else's, on a
shared host): lookups answer from this process's memo and the snapshot file, a miss is tuned
here, and nothing is uploaded. :class:`WrapperClient` remembers a server's refusal of the token
(401 or 403) and names it where an upload is kept in the outbox instead of sent.

Under ``TRITON_INTERPRET=1`` the client reports no misses: the key names the interpreter's CPU,
and no daemon tunes Triton there (the CLI refuses it, a CUDA daemon claims no CPU's job), so a job
would stay queued for good. Lookups are asked as ever: a record the server holds is served.
"""

from __future__ import annotations

import atexit
import functools
import logging
from pathlib import Path
from typing import Any

from tunecache.client import Client
from tunecache.errors import ServerError, one_line
from tunecache.key import Key
from tunecache.outbox import Later, release
from tunecache.policies import VersionPolicy
from tunecache.processlock import ProcessLock
from tunecache.schemas import LookupResponse, RecordCreate
from tunecache.settings import Settings, settings_without_bad
from tunecache.triton.hostbench import interpreted

logger = logging.getLogger("tunecache.triton.autotuner")
URL_VAR = "TUNECACHE_URL"


@functools.cache
def _read() -> tuple[Settings, bool]:
    """The environment's settings, and whether ``TUNECACHE_URL`` was malformed."""
    found, problems = settings_without_bad()
    bad_url = False
    for problem in problems:
        if problem.startswith(f"{URL_VAR}="):
            bad_url = True
            logger.warning("tunecache.triton: %s; no cache server is asked (not the default "
                           "one either): the snapshot file or local tuning, nothing "
                           "uploaded", problem)  # fmt: skip
        else:
            logger.warning("tunecache.triton: %s; taking it as unset", problem)
    return found, bad_url


def settings() -> Settings:
    """The environment's settings, read once; a malformed variable is taken as unset (a
    warning each): a bad ``TUNECACHE_*`` value must not break the user's import or launch."""
    return _read()[0]


def server_url(given: str | None) -> str | None:
    """The server to ask: ``given``, else ``TUNECACHE_URL`` (or its default); ``None`` (no
    server) where ``TUNECACHE_URL`` is malformed."""
    found, bad_url = _read()
    return given or (None if bad_url else found.url)


class WrapperClient(Client):
    """The drop-in's :class:`~tunecache.client.Client`. With ``url=None`` it asks no server
    (lookups: memo and snapshot; uploads: none). It remembers the server's refusal of the token
    (401 or 403, from a lookup or an upload): an upload then waits in the outbox, unsent, with
    one warning that names the refusal."""

    def __init__(self, url: str | None, **options: Any) -> None:
        super().__init__(url or settings().url, **options)
        self.serverless = url is None
        self.refusal: ServerError | None = None
        self.told = False  # the refusal's warning was given (once a process)
        if self.serverless:
            self.resolver.sources.remove(self.server)

    def fetch_answer(self, key: Key, *, timeout: float | None = None) -> LookupResponse | None:
        try:
            return super().fetch_answer(key, timeout=timeout)
        except ServerError as exc:
            self._note(exc)
            raise

    def upload_later(self, record: RecordCreate) -> bool:
        """:meth:`Client.upload_later`, none with no server; kept in the outbox, unsent, once the
        server refused the token (sent again, it would be refused again)."""
        if self.serverless:
            return False
        what = f"upload of {record.key.kernel} ({record.key.backend})"
        later = Later(self.url, record, what)  # kept in the outbox till the server has it
        if self.refusal is not None:
            self._kept(later)
            return False

        def send() -> object:
            try:
                return self.say_pending(later.send(self))
            except ServerError as exc:
                self._note(exc)
                raise

        queued = self.server.send_later(what, send, loud=True, lost=lambda: self._kept(later))
        if not queued:
            self._kept(later)
        return queued

    def _note(self, exc: ServerError) -> None:
        if exc.status_code in (401, 403) and not exc.foreign:
            self.refusal = exc

    def _kept(self, later: Later) -> None:
        """``later`` is not sent by this process: it waits in the outbox (why, when known)."""
        taken, refusal = later.taken, self.refusal
        if refusal is None or taken is None:
            later.lost()
            return
        later.taken = None
        if not taken.exists():
            return
        kept = release(taken)
        if self.told:  # one warning a process: each later upload waits beside it
            logger.debug("tunecache.triton: %s waits in %s", later.what, kept)
            return
        self.told = True  # the server's words as ServerError shows them (escaped, one line)
        logger.warning("tunecache.triton: %s not sent: the server refused the token (%s); it "
                       "waits in %s, and so will later uploads (tunecache push --server %s sends "
                       "them with a token that can write)", later.what, one_line(refusal), kept,
                       self.url)  # fmt: skip


# A parent thread making the client at a fork would hold it in the child for good; the client
# itself is renewed in the child (tunecache.forksafe).
_CREATING = ProcessLock()


def shared_client(url: str | None, snapshot: Path | None, policy: VersionPolicy) -> Client:
    """One client per process and settings, shared by every decorated kernel (and thread: 16
    threads' first launches at once made 16 clients, each with its pool, memo and thread).
    Misses are reported to the server except under Triton's interpreter (the module's doc)."""
    with _CREATING:
        return _shared_client(server_url(url), snapshot, policy, not interpreted())


@functools.cache
def _shared_client(url: str | None, snapshot: Path | None, policy: VersionPolicy,
                   report_misses: bool = True) -> Client:  # fmt: skip
    found = settings()
    client = WrapperClient(url, timeout=found.timeout, token=found.token or "", snapshot=snapshot,
                           policy=policy, report_misses=report_misses)  # fmt: skip
    # Disputes and miss reports still queued at exit reach the server (a few seconds at most).
    atexit.register(client.close)
    return client
