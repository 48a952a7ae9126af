"""``tunecache sync --format vllm-moe -o DIR``: the team's fused-MoE configs as the engine's files.

For each ``--device`` (the engine's device name; default: this machine's GPU), the entries the
cache holds for it are written to DIR in the engine's exact file names and layout
(:mod:`tunecache.vllm_moe`), one file per shape, ready for ``VLLM_TUNED_CONFIG_FOLDER=DIR``.
Imported files (``tunecache import vllm-moe``) are written only under ``--accept imported``: they
were tuned elsewhere, by someone else, and never validated here. The server is not trusted: every
file is held to the closed schema again and must be stored under its own device and shape; one
that is not is skipped (counted, one line). A file is written whole (a rename), so a running
engine never reads half of one; one that cannot be written is one line, exit 2.

Exit 0 written, 1 nothing to write, 2 bad input, 3 the server could not be reached.
"""

from __future__ import annotations

import argparse
import sys

from tunecache.errors import InvalidInput
from tunecache.folders import output_dir
from tunecache.vllm_moe import (
    NAMESPACE,
    MoeFile,
    MoeShape,
    check_device_name,
    imported_contents,
    imported_name_problem,
    write_file,
)
from tunecache_cli.args import server_url


def write_folder(args: argparse.Namespace) -> int:
    from tunecache.client import Client
    from tunecache.http import Timeout

    if args.arch:
        raise InvalidInput("--arch goes with a snapshot; with --format vllm-moe, name --device")
    if args.output is None:
        raise InvalidInput("--format vllm-moe needs -o DIR, the folder to write the files in")
    devices = [check_device_name(d) for d in args.device or [_this_gpu()]]
    if "imported" not in args.accept:
        raise InvalidInput("the cache's fused-MoE files are imported ones (tunecache import "
                           "vllm-moe: tuned elsewhere, never validated here): write them with "
                           "--accept imported")  # fmt: skip
    folder = output_dir(args.output)  # made only once the command is known to be good
    with Client(server_url(args), timeout=Timeout(write=args.timeout)) as client:
        fetched = {d: client.get_artifacts(NAMESPACE, d, timeout=args.timeout) for d in devices}
    written = 0
    for device, items in fetched.items():
        files, skipped = _files(device, [(i.key, i.item, i.value) for i in items])
        for shape, contents in sorted(files.items(), key=lambda kv: kv[0].file_name()):
            write_file(folder, shape, contents)
        entries = sum(len(c.table) for c in files.values())
        print(f"{device}: wrote {len(files)} file{'' if len(files) == 1 else 's'} "
              f"({entries} entries, imported) to {folder}"
              + (f"; skipped {skipped} outside the schema" if skipped else "")
              + ("" if items else " (none stored for this device; a server under the verified "
                                  "policy serves only trusted tokens' imports)"),
              file=sys.stderr)  # fmt: skip
        written += len(files)
    return 0 if written else 1


def _files(
    device: str, items: list[tuple[str, str, object]]
) -> tuple[dict[MoeShape, MoeFile], int]:
    """Each shape's file from a device's ``(key, item, value)`` items; and how many were
    skipped as outside the schema or misnamed (a server is not trusted)."""
    files: dict[MoeShape, MoeFile] = {}
    skipped = 0
    for key, item, value in items:
        if imported_name_problem(device, key, item, value) is not None:
            skipped += 1
            continue
        try:
            files[MoeShape.of_artifact(device, key)] = imported_contents(value)
        except InvalidInput:
            skipped += 1
    return files, skipped


def _this_gpu() -> str:
    try:
        import torch

        visible = bool(torch.cuda.is_available())
    except ImportError:  # a client-only install: no torch, so no GPU it can name
        visible = False
    if not visible:
        raise InvalidInput("--device: no GPU is visible here; name the engine's device as in its "
                           "file names, e.g. --device NVIDIA_H100")  # fmt: skip
    return str(torch.cuda.get_device_name(0)).replace(" ", "_")
