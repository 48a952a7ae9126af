"""Argument parsing shared by the commands: shapes, servers, key options."""

from __future__ import annotations

import argparse
import re

from tunecache.errors import InvalidInput
from tunecache.key import BACKENDS, DTYPES, MAX_DIM, Key, describe, key_for
from tunecache.settings import Settings

_INTEGER = re.compile(r"-?[0-9]+")  # int() also takes "١٢" (Arabic-Indic), "1_000", "+8"


def parse_shape(text: str) -> dict[str, int]:
    """``"M=64,N=64,K=64"`` → ``{"M": 64, "N": 64, "K": 64}``.

    Raises:
        InvalidInput: naming the malformed part.
    """
    shape: dict[str, int] = {}
    shown = describe(text, 60)
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise InvalidInput(f"malformed shape {shown}: expected NAME=INT[,NAME=INT...]")
        if name in shape:
            raise InvalidInput(f"malformed shape {shown}: {name} given twice")
        if not _INTEGER.fullmatch(value):
            raise InvalidInput(
                f"malformed shape {shown}: {name}={describe(value)} is not an integer"
            )
        if len(value.lstrip("-")) > len(str(MAX_DIM)):  # and int() refuses 4300+ digits
            raise InvalidInput(f"shape: {name}={describe(value)} is outside 1..{MAX_DIM}")
        size = int(value)
        if size < 1:
            raise InvalidInput(f"malformed shape {shown}: {name}={size} must be positive")
        shape[name] = size
    return shape


def add_server(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server", metavar="URL", help="cache server (default: $TUNECACHE_URL or the local one)"
    )


def server_url(args: argparse.Namespace) -> str:
    url: str = args.server or Settings.from_env().url
    if not url.startswith(("http://", "https://")):
        raise InvalidInput(f"--server {url!r} must start with http:// or https://")
    return url.rstrip("/")


def upload_url(args: argparse.Namespace) -> str | None:
    """The server a tuning command uploads to (``None`` with ``--no-upload``).

    Raises:
        InvalidInput: uploading, but ``$TUNECACHE_TOKEN`` is unset: said before any work is done.
    """
    if args.no_upload:
        return None
    url = server_url(args)
    if not Settings.from_env().token:
        raise InvalidInput(
            "uploading needs a token with the 'write' scope in $TUNECACHE_TOKEN "
            "(tunecache token create --name NAME --scope write), or --no-upload"
        )
    return url


def add_key(parser: argparse.ArgumentParser, *, optional: bool = False) -> None:
    """KERNEL, ``--backend``, ``--dtype``, ``--shape``; ``optional``: the command checks them."""
    parser.add_argument(
        "workload",
        nargs="?" if optional else None,
        metavar="KERNEL",
        help="a built-in kernel (see `tunecache workloads`) or your own, as package.module:Class",
    )
    # Backends and dtypes are checked by the workload, so the error names what it supports.
    parser.add_argument("--backend", required=not optional, help=f"one of {', '.join(BACKENDS)}")
    parser.add_argument("--dtype", default="float32", help=f"one of {', '.join(DTYPES)}")
    parser.add_argument(
        "--shape", required=not optional, help="shape parameters, e.g. M=64,N=64,K=64"
    )


def key_from_args(args: argparse.Namespace) -> Key:
    """The key the command line names, on this machine's device for the backend.

    Raises:
        InvalidInput: a bad kernel, backend, dtype or shape, or a CUDA key without a GPU.
    """
    return key_for(args.workload, args.backend, parse_shape(args.shape), args.dtype)
