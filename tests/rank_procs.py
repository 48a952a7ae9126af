"""The ranks of a test's ``torch.distributed`` job, each a subprocess: what each printed last."""

from __future__ import annotations

import json
import subprocess
from typing import Any


def answers(ranks: list[subprocess.Popen[str]], timeout: float) -> list[Any]:
    """The JSON each rank printed last, in rank order (a rank that failed fails the test with
    its stderr); every rank still running when one fails is killed."""
    found = []
    try:
        for process in ranks:
            out, err = process.communicate(timeout=timeout)
            assert process.returncode == 0, err[-3000:]
            found.append(json.loads(out.splitlines()[-1]))
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.communicate()
    return found
