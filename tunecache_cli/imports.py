"""``tunecache import vllm-moe DIR``: a serving engine's tuned fused-MoE config files, stored.

Every ``*.json`` file of DIR (vLLM's ``fused_moe/configs/`` or a ``VLLM_TUNED_CONFIG_FOLDER``)
is read and checked before anything is sent (:mod:`tunecache.vllm_moe`:
the name gives experts, intermediate size, device, dtype and block shape; each entry the kernel's
config at a batch size M): one file that does not parse is one line naming it and the entry, exit
2, nothing imported. Each file is stored whole, as one of the artifact store's ``vllm.moe``
items — the device the partition, the shape the key — with its name, its Triton version and
``--origin``, marked imported: ``tunecache sync --format vllm-moe`` writes them back only with
``--accept imported``. A later import of the same file replaces it, whole (never a mix of two
files). Files go 500 to a request: if the server fails part-way, the first requests' files are
stored (each whole); import again.

Exit 0 imported, 2 bad input, 3 the server could not be reached, 4 it refused the token.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tunecache.artifacts import unserved
from tunecache.errors import InvalidInput
from tunecache.settings import Settings
from tunecache.vllm_moe import NAMESPACE, imported_value, read_file
from tunecache_cli.args import add_server, preflight, server_url

MAX_FILES = 10_000


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "import", help="a serving engine's tuned config files, into the cache"
    )
    formats = parser.add_subparsers(dest="format", metavar="FORMAT", required=True)
    moe = formats.add_parser("vllm-moe", help="vLLM's (or SGLang's) fused-MoE config files",
                             description=(__doc__ or "").split("\n\n")[1])  # fmt: skip
    moe.add_argument("folder", type=Path, metavar="DIR", help="the folder of config files")
    moe.add_argument("--origin", default="", metavar="TEXT",
                     help="where the files came from, kept with each entry (e.g. "
                          "'vllm-project/vllm@2a4fe63')")  # fmt: skip
    add_server(moe)
    moe.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tunecache.artifacts import ArtifactIn
    from tunecache.client import Client

    if len(args.origin) > 512 or not args.origin.isprintable():
        raise InvalidInput("--origin must be one line of at most 512 characters")
    items = []
    for path in config_files(args.folder):
        shape, contents = read_file(path)
        value = imported_value(path.name, args.origin, contents)
        items.append(ArtifactIn(namespace=NAMESPACE, partition=shape.device_name,
                                key=shape.artifact_key(), value=value))  # fmt: skip
    url = server_url(args)
    preflight(url, "write", "importing")
    with Client(url, timeout=Settings.from_env(with_url=False).timeout) as client:
        result = client.put_artifacts(items)
    devices = sorted({item.partition for item in items})
    entries = sum(len(item.value["configs"]) for item in items if isinstance(item.value, dict))
    print(f"imported {len(items)} file{'' if len(items) == 1 else 's'} ({entries} entries; "
          f"{', '.join(devices)}) into {url} as {NAMESPACE}: {result.stored} stored, "
          f"{result.kept} kept as they were{unserved(result)}", file=sys.stderr)  # fmt: skip
    return 0


def config_files(folder: Path) -> list[Path]:
    """The ``*.json`` files of ``folder``, by name.

    Raises:
        InvalidInput: not a folder, or none there.
    """
    if not folder.is_dir():
        raise InvalidInput(f"{folder} is not a folder")
    files = sorted(folder.glob("*.json"))
    for path in files:  # every file is checked: one that cannot be is named, not passed over
        if not path.is_file():
            raise InvalidInput(f"{path}: not a readable file (a folder, or a broken link)")
    if not files:
        raise InvalidInput(f"{folder} holds no *.json config files")
    if len(files) > MAX_FILES:
        raise InvalidInput(f"{folder} holds {len(files)} *.json files, over {MAX_FILES}")
    return files
