"""Writing a benchmark's table to ``bench/results/<name>-<machine>.md``, stamped and described."""

from __future__ import annotations

import datetime
import sys
from collections.abc import Sequence
from pathlib import Path

from tunecache.device import local_fingerprint

RESULTS = Path(__file__).with_name("results")


def machine() -> str:
    """This machine in words: ``Intel(R) Xeon(R) Processor, 2 cores, arch cpu-avx512; no GPU``."""
    device = local_fingerprint("cpu")
    return f"{device.raw_name or device.name}, {device.units} cores, arch {device.arch}; no GPU"


def write_result(name: str, title: str, notes: Sequence[str], table: str) -> Path:
    """Writes ``# title``, the machine, ``notes`` as bullets, the run time and ``table``."""
    device = local_fingerprint("cpu")
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    bullets = [f"- machine: {machine()}", *(f"- {n}" for n in notes), f"- run: {stamp}"]
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{name}-{device.name}.md"
    out.write_text("\n".join([f"# {title}", "", *bullets, "", "```", table, "```", ""]))
    print(f"wrote {out}", file=sys.stderr)
    return out
