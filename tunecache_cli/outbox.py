"""The outbox seen from the CLI: a tune's upload kept until the server has it
(:mod:`tunecache.outbox`), its failure said in one line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tunecache.errors import ServerError
from tunecache.outbox import Upload, done, own_name, put, refused_for_good, release, send, set_aside


class UploadRefused(ServerError):
    """The server refused, as invalid, an upload the tuner built (not the user's arguments): a
    failed run (exit 1), kept in the outbox's ``rejected/``."""


def kept_upload(client: Any, url: str, upload: Upload, what: str = "the record") -> Any:
    """Uploads ``upload`` to ``url`` through ``client``, kept in the outbox until the server
    answered (an outbox that cannot be written warns; the upload goes ahead all the same).

    Raises:
        ServerError: the upload failed, saying where ``what`` waits for ``tunecache push`` (or,
            refused by the server as invalid, where it is kept, never to be sent).
    """
    try:
        taken: Path | None = put(url, upload)
    except OSError as exc:
        taken = None
        print(f"tunecache: warning: not kept in the outbox ({exc}); uploading", file=sys.stderr)
    try:
        answer = send(client, upload)
    except ServerError as exc:
        if taken is None:
            where = ""
        elif refused_for_good(exc):  # never sent again: kept to be read
            where = f"; {what} is kept in {set_aside(taken, own_name(taken.name))}"
        else:
            where = f"; {what} waits in {release(taken)} (tunecache push --server {url} sends it)"
        kind = UploadRefused if refused_for_good(exc) else ServerError
        raise kind(f"{exc}{where}", status_code=exc.status_code, foreign=exc.foreign) from None
    if taken is not None:
        done(taken)
    return answer
