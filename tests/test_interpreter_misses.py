"""Under ``TRITON_INTERPRET=1`` the drop-in reports no misses: a job for the interpreter's CPU
would wait in the queue for good (no daemon tunes Triton under the interpreter), while a record
the server holds is still served there.

Triton's interpreter patches ``triton.language`` in-process, so the kernel runs in a child
process, from a module written beside the test (``triton.jit`` reads the kernel's source).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer
from tests.factories import AUTH

REPO = Path(__file__).resolve().parent.parent
KERNEL = """
import sys

import torch
import triton
import triton.language as tl

import tunecache.triton
from tunecache.triton import hostbench

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32)]


@tunecache.triton.autotune(configs=CONFIGS, key=["n"], on_miss=sys.argv[1])
@triton.jit
def add_one(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1.0, mask=mask)


x = torch.arange(40, dtype=torch.float32)
y = torch.empty_like(x)
add_one[lambda meta: (triton.cdiv(40, meta["BLOCK"]),)](x, y, 40)
assert torch.equal(y, x + 1), "wrong result"
tunecache.triton.autotuner.shared_client(None, None, "strict").close()  # queued sends sent
print("benchmarked", hostbench.calls)
"""


def _run(folder: Path, url: str, on_miss: str) -> str:
    """Runs the kernel once in a child process; its output (the configs it benchmarked)."""
    (folder / "interpreted_add_one.py").write_text(KERNEL)
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "TRITON_INTERPRET": "1", "TUNECACHE_URL": url, "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "interpreted_add_one.py", on_miss],
                          capture_output=True, text=True, timeout=300, cwd=folder,
                          env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _jobs(url: str) -> list[object]:
    answer = httpx.get(f"{url}/v1/jobs", headers=AUTH, timeout=30)
    assert answer.status_code == 200, answer.text
    items: list[object] = answer.json()["items"]
    return items


@pytest.mark.slow
def test_a_miss_under_the_interpreter_queues_no_job(server: LiveServer, tmp_path: Path) -> None:
    assert "benchmarked 0" in _run(tmp_path, server.url, "default")  # the first config
    assert _jobs(server.url) == []  # before: one queued job for the interpreter's CPU, for good


@pytest.mark.slow
def test_a_record_is_still_served_under_the_interpreter(server: LiveServer, tmp_path: Path) -> None:
    assert "benchmarked 2" in _run(tmp_path, server.url, "tune")  # tuned here and uploaded
    assert "benchmarked 0" in _run(tmp_path, server.url, "tune")  # served: nothing benchmarked
    assert _jobs(server.url) == []
