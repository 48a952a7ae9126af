"""``tunecache sync --format vllm-moe -o DIR``: the team's fused-MoE configs as the engine's files.

For each ``--device`` (the engine's device name; default: this machine's GPU), the configs the
cache holds for it are written to DIR in the engine's exact file names and layout
(:mod:`tunecache.vllm_moe`), one file per shape, ready for ``VLLM_TUNED_CONFIG_FOLDER=DIR``:

- the team's winners of the engine's own kernel (``tune workloads.vllm_moe:FusedMoE``, a preset's
  shapes), each checked by its uploader against the reference (under the server's ``verified``
  policy, verified), held to :mod:`tunecache.vllm_moe_tuned`'s rules;
- with ``--accept imported``, the files imported with ``tunecache import vllm-moe``: tuned
  elsewhere, by someone else, never validated here. Where both give an M, the tuned one is
  written. For an NVIDIA GPU (or a CPU, the interpreter's) an imported entry the engine's launch
  would fail on is skipped, one line each: a field its CUDA launch does not take (ROCm's
  ``kpack``…), tiles over the device's shared memory, and on an NVIDIA GPU a ``tl.dot`` K
  Triton refuses or more accumulators a thread than the engine's tuner tries
  (:func:`tunecache.vllm_moe_launch.launch_problem`).

The device is named as the engine names it, and what it is comes from the name (or from this
machine's GPU), never from a record (:class:`tunecache.vllm_moe.EngineDevice`).

The server is not trusted: every file and record is held to the closed schema again, an imported
file must be stored under its own device and shape, a record must be a served winner of the
engine's kernel for the device; any other is skipped (counted, one line). A file is written whole
(a rename), so a running engine never reads half of one; one that cannot be written is one line,
exit 2. A later sync removes the files it wrote that the cache no longer serves, unchanged since
(:mod:`tunecache_cli.sync_moe_ledger`); at most :data:`MAX_FILES` a device are written.

Exit 0 written, 1 nothing to write, 2 bad input, 3 the server could not be reached.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tunecache.errors import InvalidInput
from tunecache.folders import output_dir
from tunecache.vllm_moe import (
    KERNEL,
    NAMESPACE,
    EngineDevice,
    MoeFile,
    MoeShape,
    engine_device_name,
    imported_contents,
    imported_name_problem,
    write_file,
)
from tunecache.vllm_moe_launch import launch_problem
from tunecache.vllm_moe_tuned import tuned_files
from tunecache_cli.args import server_url
from tunecache_cli.sync_moe_ledger import (
    Ledger,
    as_written,
    digest,
    held,
    prune,
    write_ledger,
)
from tunecache_cli.table import counted

if TYPE_CHECKING:
    from tunecache.client import Client
    from tunecache.schemas import RecordPublic

MAX_PAGES = 200  # requests of a page each: far more than every preset's shapes on one device
MAX_FILES = 1024  # a device's files written at most: far more than every preset's shapes


def write_folder(args: argparse.Namespace) -> int:
    from tunecache.client import Client
    from tunecache.http import Timeout
    from tunecache_cli.progress import asking

    if args.arch:
        raise InvalidInput("--arch goes with a snapshot; with --format vllm-moe, name --device")
    if args.output is None:
        raise InvalidInput("--format vllm-moe needs -o DIR, the folder to write the files in")
    devices = [EngineDevice.named(d) for d in args.device] if args.device else [_this_gpu()]
    folder = output_dir(args.output)  # made only once the command is known to be good
    url = server_url(args)
    with (Client(url, timeout=Timeout(write=args.timeout)) as client,
          asking("sync", url, args.timeout)):  # fmt: skip
        winners, whole = _winners(client, args.timeout)
        imported = {d: client.get_artifacts(NAMESPACE, d.name, timeout=args.timeout) if
                    "imported" in args.accept else [] for d in devices}  # fmt: skip
    written = 0
    with held(folder, url) as ledger:  # another sync into the folder waits
        for device in devices:
            items = imported[device]
            files, skipped = _files(device, [(i.key, i.item, i.value) for i in items])
            tuned, passed_over = tuned_files(winners, device)
            merged = {s: _merge(files.get(s), tuned.get(s)) for s in {*files, *tuned}}
            every = whole and len(merged) <= MAX_FILES  # else none is removed: some left unread
            if len(merged) > MAX_FILES:  # one write token's imports wrote 20,000 files
                print(f"{device.name}: the cache serves {len(merged)} shapes; the first "
                      f"{MAX_FILES} by file name are written, the others left out",
                      file=sys.stderr)  # fmt: skip
                kept = sorted(merged, key=lambda shape: shape.file_name())[:MAX_FILES]
                merged = {shape: merged[shape] for shape in kept}
            removed = _write(folder, device.name, merged, set(files), ledger,
                             "imported" in args.accept, every)  # fmt: skip
            what = _summary(merged, tuned, "imported" in args.accept)
            print(f"{device.name}: wrote {what} to {folder}"
                  f"{_notes(skipped + passed_over, removed)}", file=sys.stderr)  # fmt: skip
            written += len(merged)
            write_ledger(folder, url, ledger)  # each device's: a later one's failure keeps it
    return 0 if written else 1


def _notes(skips: int, removed: list[str]) -> str:
    """The end of a device's line: how many entries it skipped, which files it removed."""
    said = f"; skipped {skips} outside the schema, not served here or unfit for it" if skips else ""
    if removed:
        names = ", ".join(removed[:3]) + ("…" if len(removed) > 3 else "")
        said += (f"; removed {counted(len(removed), 'file')} it wrote before that the cache no "
                 f"longer serves ({names})")  # fmt: skip
    return said


def _write(folder: Path, device: str, merged: dict[MoeShape, MoeFile], imported: set[MoeShape],
           ledger: Ledger, imported_read: bool, every: bool) -> list[str]:  # fmt: skip
    """Writes a device's files (``imported``: those an imported file went into), removes those
    an earlier sync wrote that it no longer does (where it read ``every`` file the cache
    serves), and notes both in ``ledger``; returns the names of those removed
    (:mod:`tunecache_cli.sync_moe_ledger`)."""
    now: dict[str, tuple[str, bool]] = {}
    before = ledger.get(device, {})
    for shape, contents in sorted(merged.items(), key=lambda kv: kv[0].file_name()):
        name = shape.file_name()
        theirs = (folder / name).exists() and (
            name not in before or not as_written(folder, name, before[name][0])
        )
        path = write_file(folder, shape, contents)
        if not theirs:  # a file of the user's, overwritten as ever, is never removed
            now[path.name] = (digest(path), shape in imported)
    removed = prune(folder, now, before, imported_read) if every else []
    left = {  # kept where unread (imports not read, or not every file): still this sync's
        name: entry
        for name, entry in before.items()
        if name not in now
        and name not in removed
        and (not every or (entry[1] and not imported_read))
    }
    ledger[device] = {**left, **now}
    return removed


def _winners(client: Client, timeout: float) -> tuple[list[RecordPublic], bool]:
    """Every winner of the engine's kernel the server lists, page by page (a page the server
    cut short at its byte budget is not the last: the next starts after what came), and
    whether they are all it lists."""
    from tunecache.pages import fetch_first

    listed = fetch_first(client, None, requests=MAX_PAGES, kernel=KERNEL, backend="triton",
                         winners_only=True, timeout=timeout)  # fmt: skip
    if len(listed.items) < listed.count:
        print(f"read {len(listed.items)} of the server's {listed.count} winners in {MAX_PAGES} "
              "requests (its pages are cut short at its byte budget): the others are not "
              "written", file=sys.stderr)  # fmt: skip
    return listed.items, len(listed.items) >= listed.count


def _merge(imported: MoeFile | None, tuned: MoeFile | None) -> MoeFile:
    """One file: the imported entries, and the tuned ones over them."""
    if imported is None or tuned is None:
        chosen = imported or tuned
        assert chosen is not None
        return chosen
    return MoeFile({**imported.table, **tuned.table}, tuned.triton_version)


def _summary(
    merged: dict[MoeShape, MoeFile], tuned: dict[MoeShape, MoeFile], imported: bool
) -> str:
    """What a device's files hold: ``2 files (36 entries: 18 tuned, 18 imported)``, and why
    there are none."""
    entries = sum(len(c.table) for c in merged.values())
    from_tuning = sum(len(c.table) for c in tuned.values())
    line = f"{len(merged)} file{'' if len(merged) == 1 else 's'} ({entries} entries: " + (
        f"{from_tuning} tuned, {entries - from_tuning} imported)"
    )
    if merged:
        return line
    return line + (f" (no winner of {KERNEL} tuned for this device; " + (
        "no imported file for it either: is the device named as the engine names it, such as "
        "NVIDIA_H100? A server under the verified policy serves only trusted tokens' imports)"
        if imported
        else "imported files need --accept imported)"))  # fmt: skip


def _files(
    device: EngineDevice | str, items: list[tuple[str, str, object]]
) -> tuple[dict[MoeShape, MoeFile], int]:
    """Each shape's file from a device's ``(key, item, value)`` items; and how many were
    skipped as outside the schema or misnamed (a server is not trusted), or, entry by entry (one
    line each), as what the engine's launch on the device would fail on."""
    if isinstance(device, str):
        device = EngineDevice.named(device)
    files: dict[MoeShape, MoeFile] = {}
    skipped = 0
    for key, item, value in items:
        if imported_name_problem(device.name, key, item, value) is not None:
            skipped += 1
            continue
        try:
            shape, contents = MoeShape.of_artifact(device.name, key), imported_contents(value)
        except InvalidInput:
            skipped += 1
            continue
        table = {}
        for m, entry in contents.table.items():
            problem = launch_problem(entry, device, shape, least=True)
            if problem is None:
                table[m] = entry
            else:
                print(f"{shape.file_name()}: entry M={m} skipped: {problem}", file=sys.stderr)
        skipped += len(contents.table) - len(table)
        if table:
            files[shape] = MoeFile(table, contents.triton_version)
    return files, skipped


def _this_gpu() -> EngineDevice:
    """This machine's GPU as the engine names it, its arch and shared memory as torch gives
    them (a ROCm build's GPU: as its name says, another platform)."""
    try:
        import torch

        visible = bool(torch.cuda.is_available())
    except ImportError:  # a client-only install: no torch, so no GPU it can name
        visible = False
    if not visible:
        raise InvalidInput("--device: no GPU is visible here; name the engine's device as in its "
                           "file names, e.g. --device NVIDIA_H100")  # fmt: skip
    name = engine_device_name(str(torch.cuda.get_device_name(0)))
    if getattr(torch.version, "hip", None):
        return EngineDevice.named(name)
    from tunecache.device import DeviceLimits

    props = torch.cuda.get_device_properties(0)
    shared = DeviceLimits.from_properties(props).max_shared_memory_per_block
    return EngineDevice(EngineDevice.named(name).name, "cuda", f"sm_{props.major}{props.minor}",
                        shared)  # fmt: skip
