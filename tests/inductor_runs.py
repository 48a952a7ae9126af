"""Starting ``tests/inductor_procs.py`` as a user's process, and reading its JSON report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROCS = Path(__file__).with_name("inductor_procs.py")


def start(args: Sequence[str], cache_dir: Path, **env: str) -> subprocess.Popen[str]:
    """``tests/inductor_procs.py ARGS`` started with an Inductor cache of its own (``cache_dir``,
    empty when new) and ``env`` added to this process's environment."""
    environ = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), **env}
    return subprocess.Popen([sys.executable, str(PROCS), *args], cwd=ROOT, env=environ,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def report(process: subprocess.Popen[str], timeout: float = 300) -> dict[str, Any]:
    """The process's last JSON line (``{}`` when it printed none), with its ``stdout`` and
    ``stderr``, once it exits; fails the test when it exits with an error, and kills it when it
    outlasts ``timeout``."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()  # not left compiling on one of the machine's cores
        process.communicate()
        raise
    assert process.returncode == 0, stderr[-3000:]
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    found: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    found["stdout"], found["stderr"] = stdout, stderr
    return found
