"""What ``tunecache sync`` and ``tunecache snapshot export`` share: writing a server's export of
an arch's winners, refusing a mistyped arch or a file that is not a snapshot before anything is
written, warning when nothing matched."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunecache.errors import InvalidInput
from tunecache.snapshot import SNAPSHOT_FORMAT, read_snapshot_bytes, save_snapshot
from tunecache.strict import shown
from tunecache_cli.table import counted


def write_export(path: Path, document: dict[str, Any], etag: str,
                 said: Callable[[str], str], *,
                 arch_given: str | None, **filters: str | None) -> None:  # fmt: skip
    """Writes a server's snapshot export ``document`` to ``path`` and says so (``said`` of the
    winners counted, then the ETag).

    An empty export of ``arch_given`` (the ``--arch`` typed, if any) that no device has is
    refused before anything is written; any other empty one is written and followed by a hint
    naming ``filters`` on stderr: a mistyped filter exports nothing, silently otherwise.

    Raises:
        InvalidInput: ``arch_given`` is no device's arch (:func:`refuse_unknown_arch`).
    """
    empty = not document["records"]
    if empty:
        refuse_unknown_arch(arch_given)
    save_snapshot(path, document)
    print(f"{said(counted(len(document['records']), 'winner'))} (ETag {shown(etag)})")
    if empty:
        print(nothing_matched(**filters), file=sys.stderr)


_FAMILY = SNAPSHOT_FORMAT.split("/")[0] + "/"  # every version's format starts so
# What a snapshot sync or export wrote opens with, whole or cut short: its canonical JSON's
# filters (an object of names), then its format.
_OPENING = re.compile(rb'\s*\{("filters":\{[^{}]*\},)?"format":"' + re.escape(_FAMILY.encode()))


def replaceable(label: str, path: Path) -> bytes | None:
    """The bytes of the snapshot file at ``path`` that a sync or an export will replace, or
    ``None`` where there is none (no file, or an empty one).

    A file that is not a snapshot is refused and left as it was: ``sync -o notes.txt``, or
    ``TUNECACHE_SNAPSHOT`` set to the wrong file, replaced it at every sync. A snapshot this
    version no longer reads (another format version, a record it refuses) is still replaced.

    Raises:
        InvalidInput: naming ``label`` and ``path``: it cannot be read (a folder, a FIFO, past a
            snapshot's bounds) or is not a snapshot.
    """
    if not path.exists():
        return None
    text = read_snapshot_bytes(path)
    if not text.strip():
        return None
    # Known by its opening without parsing it (sync parses it once, after): one cut short too,
    # which a lookup calls corrupt and ignores; not a file merely holding one further in
    if _OPENING.match(text):
        return text
    try:  # a snapshot written otherwise (by hand, indented): its format field
        document = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past Python's stack
        document = None
    kind = document.get("format") if isinstance(document, dict) else None
    if isinstance(kind, str) and kind.startswith(_FAMILY):
        return text
    raise InvalidInput(f"{label} {path} is a file that is not a tunecache snapshot: left as it "
                       "is (remove it, or name another file)")  # fmt: skip


def nothing_matched(**filters: str | None) -> str:
    """The warning after an export or a sync that matched no winner, naming each filter given
    (one naming the arch alone blamed it for a mistyped ``--kernel``; a sync of a mistyped arch
    said only "wrote 0 winners")."""
    given = ", ".join(f"{name.replace('_', ' ')} {value!r}" for name, value in filters.items()
                      if value is not None)  # fmt: skip
    return (
        f"tunecache: no winner matches {given}: is each a value the server has winners "
        "of? (tunecache records ls --all shows them)"
    )


def gpu_arch(arch: str) -> bool:
    """Whether ``arch`` is spelled as any NVIDIA GPU's (``sm_90``, ``sm_90a``, an older or newer
    one's than this version knows): never taken for a typo of a known one."""
    return re.fullmatch(r"sm_\d{2,3}a?", arch) is not None


def refuse_unknown_arch(arch: str | None, flag: str = "--arch") -> None:
    """After a server answered no winner of ``arch``: a mistyped one (``cpu-avx51``) is bad
    input, and nothing is written (a sync of it replaced a good snapshot with an empty one,
    exit 0). An arch the server holds is never refused, known here or not (a newer GPU's).

    Raises:
        InvalidInput: ``arch`` is no arch a device has, naming the nearest that is.
    """
    from tunecache.device import CPU_ARCHS, CUDA_ARCHS, check_arch
    from tunecache.kernels import closest

    if arch is None or gpu_arch(arch):
        return
    try:
        check_arch(arch)
    except InvalidInput:
        close = closest(arch, CUDA_ARCHS + CPU_ARCHS)
        hint = f"did you mean {close}? " if close else ""
        raise InvalidInput(f"{flag} {arch!r}: no device has that arch and the server holds no "
                           f"winner of it ({hint}`tunecache records ls` shows the archs it "
                           "holds); nothing written") from None  # fmt: skip
