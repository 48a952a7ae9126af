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

Files are taken before they are sent: renamed to ``.sending-PID-NAME`` (one process wins the
rename), so two pushers, or a pusher and the tune that wrote the record, never send one record
twice. A file taken by a process that died is waiting again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunecache.artifacts import ArtifactIn
from tunecache.errors import ServerError
from tunecache.schemas import RecordCreate
from tunecache.settings import outbox_dir, without_userinfo

logger = logging.getLogger(__name__)

TAKEN = ".sending-"
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
    process (its upload is next); returns the taken file, for :func:`done` or :func:`release`."""
    folder = folder or outbox_dir()
    folder.mkdir(parents=True, exist_ok=True)
    body, digest = _body(url, upload)
    name = f"{int(time.time() * 1000)}-{digest[:16]}.json"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".writing-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(body, out)
            out.flush()
            os.fsync(out.fileno())
        taken = folder / f"{TAKEN}{os.getpid()}-{name}"
        os.replace(tmp, taken)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return taken


def done(taken: Path) -> None:
    """The server has the upload: it leaves the outbox."""
    taken.unlink(missing_ok=True)


def own_name(name: str) -> str:
    """A file's name while it waits (``.sending-PID-NAME`` → ``NAME``)."""
    return name.removeprefix(TAKEN).split("-", 1)[1] if name.startswith(TAKEN) else name


def release(taken: Path) -> Path:
    """The upload failed: it waits under its own name; returns that file."""
    waiting = taken.with_name(own_name(taken.name))
    os.replace(taken, waiting)
    return waiting


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    return True


def _available(path: Path) -> bool:
    """Whether ``path`` waits: under its own name, or taken by a process that is gone."""
    if not path.name.startswith("."):
        return True
    if not path.name.startswith(TAKEN):
        return False  # being written
    pid = path.name.removeprefix(TAKEN).split("-", 1)[0]
    return pid.isdigit() and not _alive(int(pid))


def _available_files(folder: Path) -> Iterator[tuple[Path, dict[str, Any] | None]]:
    """The available files, oldest first, with their parsed bodies (``None``: a file that is
    not a JSON object; one gone meanwhile is left out). A file is written whole before it is
    named ``*.json`` (:func:`put`), so one that does not parse is never still being written."""
    paths = sorted(folder.glob("*.json"), key=lambda p: own_name(p.name))
    for path in paths if folder.is_dir() else []:
        if not _available(path):
            continue
        try:
            data: Any = json.loads(path.read_bytes())
        except OSError:
            continue
        except ValueError:  # not JSON, or not text
            data = None
        yield path, data if isinstance(data, dict) else None


def _waiting_for(url: str | None, folder: Path) -> Iterator[tuple[Path, Any]]:
    """The available files for ``url`` (``None``: any server), oldest first, with their parsed
    bodies (one that does not parse is for no server: :func:`set_aside_unreadable`)."""
    for path, data in _available_files(folder):
        if data is not None and (url is None or _server(data.get("url")) == _server(url)):
            yield path, data


def set_aside_unreadable(folder: Path | None = None) -> list[str]:
    """Moves the available files that hold no JSON object (truncated, binary: no server can be
    named for them) to ``rejected/``, as refused uploads are; returns their names."""
    folder = folder or outbox_dir()
    names = []
    for path, data in _available_files(folder):
        if data is not None:
            continue
        name = own_name(path.name)
        taken = folder / f"{TAKEN}{os.getpid()}-{name}"
        try:
            os.replace(path, taken)  # one process wins; the others find it gone
        except OSError:
            continue
        set_aside(taken, name)
        names.append(name)
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


def take(url: str, folder: Path | None = None) -> list[Waiting]:
    """Takes the files waiting for ``url``, oldest first (one another process took first is
    left to it); a file that holds no valid upload comes with ``upload=None``."""
    folder = folder or outbox_dir()
    found = []
    for path, data in _waiting_for(url, folder):
        name = own_name(path.name)
        taken = folder / f"{TAKEN}{os.getpid()}-{name}"
        try:
            upload: Upload | None = _parsed(data)
        except ValueError:
            upload = None
        try:
            os.replace(path, taken)  # one process wins; the others find it gone
        except OSError:
            continue
        found.append(Waiting(taken, name, url, upload))
    return found


def refused_for_good(exc: ServerError) -> bool:
    """Whether the server itself refused an upload as invalid (a 4xx other than auth, a
    timeout or a rate limit): sending it again cannot help."""
    code = exc.status_code
    return code is not None and 400 <= code < 500 and code not in (401, 403, 408, 429) \
        and not exc.foreign  # fmt: skip


def set_aside(taken: Path, name: str) -> Path:
    """Moves a taken file to ``rejected/``, to be read, never sent again; returns where."""
    aside = taken.parent / "rejected"
    aside.mkdir(exist_ok=True)
    os.replace(taken, aside / name)
    return aside / name


def waiting(url: str, folder: Path | None = None) -> int:
    """How many uploads wait for ``url`` (none taken)."""
    return sum(1 for _ in _waiting_for(url, folder or outbox_dir()))


def servers(folder: Path | None = None) -> dict[str, int]:
    """How many uploads wait for each server URL (none taken)."""
    counts: dict[str, int] = {}
    for _, data in _waiting_for(None, folder or outbox_dir()):
        if (url := _server(data.get("url"))) is not None:
            counts[url] = counts.get(url, 0) + 1
    return counts


def push(client: Any, url: str, folder: Path | None = None) -> tuple[int, int, ServerError | None]:
    """Uploads what waits for ``url`` through ``client``: ``(sent, refused, last error)``. Sent
    uploads leave; refused ones move to ``rejected/``; the rest wait (after an unreachable
    server, the others are not tried)."""
    sent, refused, error = 0, 0, None
    items = take(url, folder)
    for i, item in enumerate(items):
        if item.upload is None:  # not an upload this version can send
            set_aside(item.path, item.name)
            refused += 1
            continue
        try:
            send(client, item.upload)
        except ServerError as exc:
            error = exc
            if refused_for_good(exc):
                set_aside(item.path, item.name)
                refused += 1
                continue
            release(item.path)
            if exc.status_code is None:  # unreachable: the rest would fail alike; they wait
                for rest in items[i + 1 :]:
                    release(rest.path)
                break
            continue
        done(item.path)
        sent += 1
    return sent, refused, error


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
                self.taken = None
                logger.warning("%s is kept in %s, never to be sent", self.what, aside)
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
