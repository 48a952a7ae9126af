"""``tunecache sync``: keep a local snapshot of this machine's arch, for lookups without a server.

Downloads the server's winners for this device's arch (the GPU's when one is visible, else this
CPU's; or ``--arch``) to ``-o FILE`` (default: ``$TUNECACHE_SNAPSHOT``, else the user cache
directory, created if need be; the folder of ``-o``'s or the variable's file must exist, and a
file there must be a snapshot), atomically, and only when they changed (the file's ETag is sent
as If-None-Match).
Run-time lookups read it with ``TUNECACHE_SNAPSHOT=FILE`` (or ``Client(snapshot=FILE)``).
``--timeout`` bounds the whole download, connecting to the last byte (default 60 s).
Exit 0 written or up to date, 2 bad input, 3 server unreachable or too slow.

``--format vllm-moe -o DIR`` writes a serving engine's fused-MoE config files instead
(:mod:`tunecache_cli.sync_moe`).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from tunecache.errors import InvalidInput
from tunecache.problem import NAME
from tunecache.settings import Settings
from tunecache.strict import shown
from tunecache_cli.args import add_server, output_file, server_url
from tunecache_cli.exports import replaceable, write_export


def register(commands: Any) -> None:
    parser = commands.add_parser("sync", help="download this arch's winners to a local snapshot "
                                              "(or a serving engine's config files)")  # fmt: skip
    parser.add_argument("--arch", help="device arch (default: this machine's GPU, else CPU)")
    where = ("snapshot file (default: $TUNECACHE_SNAPSHOT or the cache dir); with --format "
             "vllm-moe, the folder to write the engine's config files in")  # fmt: skip
    parser.add_argument("-o", "--output", type=Path, metavar="FILE", help=where)
    parser.add_argument("--format", choices=("snapshot", "vllm-moe"), default="snapshot",
                        help="a tunecache snapshot (default), or vLLM's fused-MoE config files "
                             "(for VLLM_TUNED_CONFIG_FOLDER)")  # fmt: skip
    parser.add_argument("--device", action="append", metavar="NAME",
                        help="vllm-moe: the engine's device name, as in its file names "
                             "(NVIDIA_H100); repeatable; default: this machine's GPU")  # fmt: skip
    parser.add_argument("--accept", action="append", choices=("imported",), default=[],
                        help="vllm-moe: also write imported entries (tunecache import), not "
                             "only what was tuned and validated")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="seconds the whole download may take (default 60)")  # fmt: skip
    add_server(parser)
    parser.set_defaults(run=run)


def this_arch() -> str:
    """The arch of this machine's GPU when one is visible, else of its CPU."""
    from tunecache.device import local_device

    try:
        return local_device("cuda").fingerprint.arch
    except InvalidInput:
        return local_device("cpu").fingerprint.arch


def default_path(arch: str) -> Path:
    """Where ``sync`` writes ``arch``'s snapshot with neither ``-o`` nor ``TUNECACHE_SNAPSHOT``:
    the user cache directory (created if need be)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("tunecache")) / f"snapshot-{arch}.json"


def run(args: argparse.Namespace) -> int:
    from tunecache.client import Client
    from tunecache.http import Timeout
    from tunecache.snapshot import SnapshotFilters, snapshot_etag, validated_snapshot
    from tunecache_cli.progress import asking

    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise InvalidInput(f"--timeout must be a positive number of seconds, not {args.timeout:g}")
    if args.format == "vllm-moe":
        from tunecache_cli.sync_moe import write_folder

        return write_folder(args)
    if args.device or args.accept:
        raise InvalidInput("--device and --accept go with --format vllm-moe")
    configured = None if args.output else Settings.from_env(with_url=False).snapshot
    if args.output is not None:  # before the server is asked; its folder is never created
        output_file("-o", args.output)
    elif configured is not None:  # a mistyped folder in the variable alike (it was made)
        output_file("TUNECACHE_SNAPSHOT", configured)
    if args.arch is not None and not NAME.fullmatch(args.arch):  # '' read as no --arch at all
        raise InvalidInput(f"--arch {args.arch!r}: expected a device arch, such as sm_90")
    arch = args.arch or this_arch()
    path = args.output or configured or default_path(arch)
    held = None
    text = replaceable("-o" if args.output else "TUNECACHE_SNAPSHOT" if configured else
                       "the snapshot", path)  # fmt: skip
    if text is not None:
        try:
            snapshot = validated_snapshot(path, text)
        except InvalidInput:
            snapshot = None  # a snapshot this version does not read is replaced
        # Only a snapshot of exactly this arch is up to date by its ETag: every empty snapshot
        # has one ETag, and an empty sm_80 file read as an up-to-date sm_90 one.
        if snapshot is not None and snapshot.filters == SnapshotFilters(device_arch=arch):
            held = snapshot_etag(snapshot.records)
    url = server_url(args)
    with (Client(url, timeout=Timeout(write=args.timeout)) as client,
          asking("sync", url, args.timeout)):  # fmt: skip
        document, etag = client.export_snapshot(arch, if_none_match=held)
    if document is None:
        print(f"{path} is up to date ({arch}, ETag {shown(etag)})")
        return 0
    write_export(path, document, etag, lambda n: f"wrote {n} of {arch} to {path}",
                 arch_given=args.arch, arch=arch)  # fmt: skip
    return 0
