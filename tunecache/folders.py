"""Folders a command writes into (``report -o DIR``, ``sync --format vllm-moe -o DIR``): made if
need be and checked writable before any work, each refusal one line."""

from __future__ import annotations

import os
from pathlib import Path

from tunecache.errors import InvalidInput


def output_dir(path: Path) -> Path:
    """``path`` as a folder a command can write into, created if need be.

    Raises:
        InvalidInput: it cannot be created, is not a folder, or is not writable.
    """
    if path.exists() and not path.is_dir():
        raise InvalidInput(f"output {path} is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput(f"cannot create output folder {path}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise InvalidInput(f"output folder {path} is not writable")
    return path
