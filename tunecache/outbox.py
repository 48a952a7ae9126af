"""The outbox: what a tune uploads, kept on disk until the server has it.

A tune can take an hour; the upload at its end can fail (the server restarting, the network, a
token revoked meanwhile). So what it uploads — a tuning record, or the artifacts of ``tune
--torch`` and ``tune --tvm`` (Inductor's choices, MetaSchedule's records) — is written here first,
atomically, with the server it is for, and removed once that server answered the upload; what is
left is sent by ``tunecache push`` (also run, quietly, when the next tune for that server
starts). The Triton drop-in keeps the winners it tunes here too
(:meth:`tunecache.client.Client.upload_later`): one its process could not upload (the server
down, the process exiting first) waits for ``tunecache push``. An upload the server refuses as
invalid (a 4xx of its own, other than auth) is moved to ``rejected/``, to be read, never sent
again.

Files are taken before they are sent, under a lock the kernel drops when their process dies, and
only this user's files, in a folder only this user can write, are read, within bounds
(:mod:`tunecache.outbox_files`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tunecache.artifacts import ArtifactIn
from tunecache.errors import ServerError
from tunecache.folders import own_folder
from tunecache.outbox_files import (
    TAKEN,
    Found,
    checked_folder,
    files,
    let_go,
    new_held,
    own_name,
    rename_held,
    sweep_unfinished,
    take_found,
)
from tunecache.schemas import RecordCreate
from tunecache.settings import without_userinfo

logger = logging.getLogger(__name__)

Upload = RecordCreate | list[ArtifactIn]  # a tuning record, or artifacts stored together


@dataclass(frozen=True)
class Waiting:
    path: Path  # the file as taken by this process
    name: str  # its name while it waits
    url: str
    upload: Upload | None  # None: the file holds no upload this version can send


def send(client: Any, upload: Upload) -> Any:
    """Uploads ``upload`` through ``client``; returns the server's answer.

    Raises:
        ServerError: the server is unreachable or refused it.
    """
    if isinstance(upload, RecordCreate):
        return client.upload(upload)
    return client.put_artifacts(upload)


def stored_unserved(answer: Any) -> bool:
    """Whether the server's answer to an upload says it is stored but not served: a record
    pending under the verified policy (until a verifier passes it), artifacts the policy
    serves to no one (``served`` false: a token not trusted)."""
    if getattr(answer, "served", None) is False:
        return True
    pending = getattr(answer, "status", None) == "pending"
    return pending and getattr(answer, "policy", None) == "verified"


def _body(url: str, upload: Upload) -> tuple[dict[str, Any], str]:
    """The file's JSON and what names it (the record's key, or the artifacts' digest)."""
    if isinstance(upload, RecordCreate):
        return {"url": url, "record": upload.model_dump(mode="json", by_alias=True)}, \
            upload.key.to_key().digest()  # fmt: skip
    items = [item.model_dump(mode="json") for item in upload]
    text = json.dumps(items, sort_keys=True).encode()
    return {"url": url, "artifacts": items}, hashlib.sha256(text).hexdigest()


def _parsed(data: dict[str, Any]) -> Upload:
    """The upload a file holds, validated as the server would (a local file, but checked).

    Raises:
        ValueError: it holds neither a valid record nor a list of valid artifacts.
    """
    if "artifacts" in data:
        items = data["artifacts"]
        if not isinstance(items, list) or not items:
            raise ValueError("artifacts: not a list of artifacts")
        return [ArtifactIn.model_validate(item) for item in items]
    return RecordCreate.model_validate(data.get("record"))


def put(url: str, upload: Upload, folder: Path | None = None) -> Path:
    """Writes ``upload`` for ``url`` into the outbox (whole or not at all), taken by this
    process (its upload is next; its lock held from before it is named); returns the taken
    file, for :func:`done` or :func:`release`.

    Raises:
        OSError: the outbox cannot be written, or is refused (:mod:`tunecache.outbox_files`).
    """
    folder = checked_folder(folder, make=True)
    assert folder is not None
    body, digest = _body(url, upload)
    # Named by the time in ns: files are sent in name order, and two put in one millisecond
    # (named by ms) went in the order of their digests (the fresh-clone CI caught it once).
    name = f"{time.time_ns()}-{digest[:16]}.json"
    sweep_unfinished(folder)
    tmp, out = new_held(folder)
    try:
        data = memoryview(json.dumps(body).encode("utf-8"))
        while data:  # unbuffered (new_held): a write may take part of it
            data = data[out.write(data) or 0 :]
        os.fsync(out.fileno())
        taken = folder / f"{TAKEN}{os.getpid()}-{name}"
        rename_held(tmp, taken)
    except BaseException:
        let_go(tmp)  # closed first (a full disk's flush fails again): else it stayed behind
        tmp.unlink(missing_ok=True)
        raise
    return taken


def done(taken: Path) -> None:
    """The server has the upload: it leaves the outbox (one that cannot be removed waits, and
    a push sends it again: the server stores an upload sent twice once). Never raises: it runs
    in the caller's thread, after its upload went well."""
    try:
        with contextlib.suppress(OSError):
            taken.unlink(missing_ok=True)
    finally:
        let_go(taken)


def release(taken: Path) -> Path:
    """The upload failed: it waits under its own name; returns that file. Should the rename
    fail, the lock is let go all the same and the file waits under its taken name (returned):
    never raises, as it runs in the caller's thread (a Triton launch's, a process exiting)."""
    waiting = taken.with_name(own_name(taken.name))
    try:
        os.replace(taken, waiting)
    except OSError:
        waiting = taken
    finally:
        let_go(taken)
    return waiting


def _for(url: str | None, found: Found) -> bool:
    """Whether ``found`` holds an upload for ``url`` (``None``: for any server)."""
    return found.data is not None and (
        url is None or _server(found.data.get("url")) == _server(url)
    )


def set_aside_unreadable(folder: Path | None = None) -> list[str]:
    """Moves the available files that hold no JSON object (truncated, binary: no server can be
    named for them) to ``rejected/``, as refused uploads are, and those that are no file to
    read (a FIFO, a link, past :data:`MAX_FILE_BYTES`, each named with why); returns their
    names. One ``rejected/`` cannot take waits where it is (:func:`set_aside` says why).

    Raises:
        OSError: the outbox folder is refused (:mod:`tunecache.outbox_files`).
    """
    names = []
    for found in files(folder):
        if found.data is not None or not found.lock(exclusive=True):
            continue
        name = own_name(found.path.name)
        if found.file is None:  # nobody can send it: no lock to hold
            taken = found.path.with_name(f"{TAKEN}{os.getpid()}-{name}")
            with contextlib.suppress(OSError):
                os.replace(found.path, taken)
        elif (taken_or_none := take_found(found)) is not None:
            taken = taken_or_none
        else:
            continue
        if set_aside(taken, name).parent.name == "rejected":
            names.append(f"{name}: {found.problem}" if found.problem else name)
    return names


def _server(url: Any) -> str | None:
    """The server a file waits for, as a message may show it and ``--server`` names it: files
    written before URLs with a user name or password were refused hold one (never shown), and
    ``HTTP://`` is ``http://``."""
    if not isinstance(url, str):
        return None
    shown = without_userinfo(url).rstrip("/")
    scheme = shown.find("://")
    return shown if scheme < 0 else shown[:scheme].lower() + shown[scheme:]


def take(
    url: str, folder: Path | None = None, *, limit: int | None = None,
    skip: Collection[str] = (),
) -> list[Waiting]:  # fmt: skip
    """Takes the files waiting for ``url``, oldest first, at most ``limit`` (each is held open
    until it is done with), none of those named in ``skip`` (one another process took first
    is left to it); a file that holds no valid upload comes with ``upload=None``.

    Raises:
        OSError: the outbox folder is refused (:mod:`tunecache.outbox_files`).
    """
    taken_ones: list[Waiting] = []
    for found in files(folder):
        if limit is not None and len(taken_ones) >= limit:
            break
        if own_name(found.path.name) in skip or not _for(url, found):
            continue
        if not found.lock(exclusive=True):
            continue
        assert found.data is not None
        try:
            upload: Upload | None = _parsed(found.data)
        except ValueError:
            upload = None
        if (taken := take_found(found)) is not None:
            taken_ones.append(Waiting(taken, own_name(taken.name), url, upload))
    return taken_ones


def refused_for_good(exc: ServerError) -> bool:
    """Whether the server itself refused an upload as invalid (a 4xx other than auth, a
    timeout or a rate limit): sending it again cannot help."""
    code = exc.status_code
    return code is not None and 400 <= code < 500 and code not in (401, 403, 408, 429) \
        and not exc.foreign  # fmt: skip


def set_aside(taken: Path, name: str) -> Path:
    """Moves a taken file to ``rejected/``, to be read, never sent again; returns where. When
    ``rejected/`` cannot take it (a file of that name, a folder not writable), one warning
    names the folder and why, and the file waits again under its own name (nothing is lost;
    a push sends it again); returns that file."""
    aside = taken.parent / "rejected"
    try:  # a link planted while an older version left the outbox open moved uploads elsewhere
        own_folder(aside, "the outbox's rejected folder", close=True)  # made 0775 by <0.x
        os.replace(taken, aside / name)
    except OSError as exc:
        why = _not_taken(aside, exc)
        logger.warning("%s cannot be set aside in %s (%s): it waits in %s, to be sent again",
                       name, aside, why, taken.parent)  # fmt: skip
        return release(taken)
    let_go(taken)
    return aside / name


def _not_taken(aside: Path, exc: OSError) -> str:
    """Why ``rejected/`` could not take a file, in a few words."""
    if isinstance(exc, NotADirectoryError | FileExistsError) and os.path.lexists(aside):
        return f"{'a link' if os.path.islink(aside) else 'a file'}, not a folder"
    return str(exc.strerror if exc.filename and exc.strerror else exc)


def _counted(url: str | None, folder: Path | None) -> Iterator[tuple[Found, bool]]:
    """The files holding an upload for ``url`` (``None``: any server), each with whether it
    waits (``False``: a live process is sending it). Only taken files are tried, as readers:
    one under its own name waits, and trying its lock could make a pusher skip it."""
    for found in files(folder):
        if _for(url, found):
            yield found, not found.path.name.startswith(TAKEN) or found.lock(exclusive=False)


def waiting(url: str, folder: Path | None = None) -> int:
    """How many uploads wait for ``url`` (none a live process is sending: :func:`sending`)."""
    return sum(free for _, free in _counted(url, folder))


def sending(url: str, folder: Path | None = None) -> int:
    """How many uploads for ``url`` another live process (or this one) is sending now."""
    return sum(not free for _, free in _counted(url, folder))


def unreadable(folder: Path | None = None) -> int:
    """How many files hold no upload still (``rejected/`` could not take them)."""
    return sum(found.data is None for found in files(folder))


def servers(folder: Path | None = None) -> dict[str, int]:
    """How many uploads wait for each server URL (none a live process is sending)."""
    counts: dict[str, int] = {}
    for found, free in _counted(None, folder):
        if free and (url := _server(found.data and found.data.get("url"))) is not None:
            counts[url] = counts.get(url, 0) + 1
    return counts


# The files a push holds taken (open, locked) at once: all of a few thousand waiting would use up
# the process's file descriptors (1,024 by default), its connections to the server among them.
TAKEN_AT_ONCE = 64


class Pushed(NamedTuple):
    """What :func:`push` did: uploads sent (``unserved`` of them stored but not served:
    :func:`stored_unserved`), refused (set aside), and the last error (``None``: none)."""

    sent: int
    refused: int
    error: ServerError | None
    unserved: int = 0


def push(client: Any, url: str, folder: Path | None = None) -> Pushed:
    """Uploads what waits for ``url`` through ``client``, :data:`TAKEN_AT_ONCE` files at a
    time, each tried once. Sent uploads leave; refused ones move to ``rejected/``; the rest
    wait (after an unreachable server, the others are not tried; one ``rejected/`` could not
    take waits too)."""
    done = Pushed(0, 0, None)
    tried: set[str] = set()
    while items := take(url, folder, limit=TAKEN_AT_ONCE, skip=tried):
        tried.update(item.name for item in items)
        more, unreachable = _push_taken(client, items)
        done = Pushed(done.sent + more.sent, done.refused + more.refused,
                      more.error or done.error, done.unserved + more.unserved)  # fmt: skip
        if unreachable:
            break
    return done


def _push_taken(client: Any, items: list[Waiting]) -> tuple[Pushed, bool]:
    """:func:`push` of the files taken, and whether the server was unreachable; the files not
    sent wait again."""
    outcomes: list[str] = []
    error, done_with = None, 0
    try:
        for item in items:
            outcome = _push_one(client, item)
            done_with += 1
            if isinstance(outcome, ServerError):
                error = outcome
                if outcome.status_code is None:  # unreachable: the rest would fail alike
                    return _counted_outcomes(outcomes, error), True
            else:
                outcomes.append(outcome)
        return _counted_outcomes(outcomes, error), False
    finally:  # however it ended (an error of another kind too): the rest wait again
        for rest in items[done_with:]:
            release(rest.path)


def _counted_outcomes(outcomes: list[str], error: ServerError | None) -> Pushed:
    sent = outcomes.count("sent") + outcomes.count("unserved")
    return Pushed(sent, outcomes.count("refused"), error, outcomes.count("unserved"))


def _push_one(client: Any, item: Waiting) -> str | ServerError:
    """One taken file pushed: ``sent``, ``unserved`` (sent, stored, not served), ``refused``
    (set aside), ``waits`` (a ``rejected/`` that could not take it), or the server's error (the
    file waits again)."""
    if item.upload is None:  # not an upload this version can send
        return "refused" if _aside(item) else "waits"
    try:
        answer = send(client, item.upload)
    except ServerError as exc:
        if refused_for_good(exc):
            return "refused" if _aside(item) else "waits"
        release(item.path)
        return exc
    done(item.path)
    return "unserved" if stored_unserved(answer) else "sent"


def _aside(item: Waiting) -> bool:
    """Sets ``item`` aside (:func:`set_aside`); whether it is (else it waits again)."""
    return set_aside(item.path, item.name).parent != item.path.parent


class Later:
    """An upload sent later, from a background thread, kept in the outbox meanwhile: it leaves
    once the server has it (:meth:`send`), moves to ``rejected/`` when the server refuses it as
    invalid, and waits for ``tunecache push`` once given up (:meth:`lost`: the server down past
    the retries, the process closing first). An outbox that cannot be written is a warning; the
    upload goes ahead all the same."""

    def __init__(self, url: str, upload: Upload, what: str) -> None:
        self.upload, self.what, self.url = upload, what, url
        self.taken: Path | None = None
        try:
            self.taken = put(url, upload)
        except OSError as exc:
            logger.warning("%s not kept in the outbox (%s); uploading", what, exc)

    def send(self, client: Any) -> Any:
        """Uploads it through ``client``; returns the server's answer.

        Raises:
            ServerError: the server is unreachable or refused it.
        """
        try:
            answer = send(client, self.upload)
        except ServerError as exc:
            if self.taken is not None and refused_for_good(exc):
                aside = set_aside(self.taken, own_name(self.taken.name))
                if aside.parent != self.taken.parent:  # else set_aside said where it waits
                    logger.warning("%s is kept in %s, never to be sent", self.what, aside)
                self.taken = None
            raise
        if self.taken is not None:
            done(self.taken)
            self.taken = None
        return answer

    def lost(self) -> None:
        """Not sent, and no longer tried by this process: it waits for ``tunecache push``."""
        if self.taken is not None and self.taken.exists():
            logger.warning("%s waits in %s (tunecache push --server %s sends it)", self.what,
                           release(self.taken), self.url)  # fmt: skip
        self.taken = None
