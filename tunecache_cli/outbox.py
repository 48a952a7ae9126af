"""The outbox: a finished tune's record, kept on disk until the server has it.

A tune can take an hour; the upload at its end can fail (the server restarting, the network, a
token revoked meanwhile). So the record is written here first, atomically, with the server it is
for, and removed once that server answered the upload; what is left is sent by ``tunecache push``
(also run, quietly, when the next tune for that server starts). A record the server refuses as
invalid (a 4xx other than auth) is moved to ``rejected/``, to be read, never sent again.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunecache.errors import ServerError
from tunecache.schemas import RecordCreate
from tunecache.settings import outbox_dir


@dataclass(frozen=True)
class Waiting:
    path: Path
    url: str
    record: RecordCreate


def put(url: str, record: RecordCreate, folder: Path | None = None) -> Path:
    """Writes ``record`` for ``url`` into the outbox (whole or not at all); returns its file."""
    folder = folder or outbox_dir()
    folder.mkdir(parents=True, exist_ok=True)
    body = {"url": url, "record": record.model_dump(mode="json", by_alias=True)}
    name = f"{int(time.time() * 1000)}-{record.key.to_key().digest()[:16]}.json"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".writing-", suffix=".json")
    with os.fdopen(fd, "w") as out:
        json.dump(body, out)
        out.flush()
        os.fsync(out.fileno())
    path = folder / name
    os.replace(tmp, path)
    return path


def waiting(url: str, folder: Path | None = None) -> list[Waiting]:
    """The records waiting for ``url``, oldest first (a file that does not parse is skipped)."""
    folder = folder or outbox_dir()
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data: Any = json.loads(path.read_text())
            if data.get("url") != url:
                continue
            found.append(Waiting(path, url, RecordCreate.model_validate(data["record"])))
        except (OSError, ValueError, KeyError, AttributeError):
            continue  # not ours to send: left where it is
    return found


def push(client: Any, url: str, folder: Path | None = None) -> tuple[int, int, list[str]]:
    """Uploads what waits for ``url`` through ``client``: ``(sent, rejected, errors)``. Sent
    records are removed; refused ones move to ``rejected/``; unreachable ones stay."""
    sent, rejected, errors = 0, 0, []
    for item in waiting(url, folder):
        try:
            client.upload(item.record)
        except ServerError as exc:
            if exc.status_code is not None and 400 <= exc.status_code < 500 \
                    and exc.status_code not in (401, 403, 408, 429):  # fmt: skip
                item.path.parent.joinpath("rejected").mkdir(exist_ok=True)
                os.replace(item.path, item.path.parent / "rejected" / item.path.name)
                rejected += 1
            errors.append(str(exc))
            if exc.status_code is None:  # unreachable: the rest would fail alike
                break
            continue
        item.path.unlink(missing_ok=True)
        sent += 1
    return sent, rejected, errors
