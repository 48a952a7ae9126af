"""What ``tunecache pretune --local`` says: nothing of CUDA for a manifest of CPU keys, and a
closing line whose elapsed time counts the tuning it did before following the jobs."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LiveServer
from tunecache_cli import main, pretune

CPU_MANIFEST = '[[tune]]\nkernel = "softmax"\nbackends = ["tvm"]\nshapes = [{M = 8, N = 8}]\n'
TUNED_FOR = 120.0  # seconds the clock is moved on while --local tunes


class _Clock:
    """Time as ``pretune`` reads it: the real clock, moved on by ``ahead`` seconds."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def __getattr__(self, name: str) -> Any:  # the rest of the module: time(), strftime()...
        return getattr(time, name)


@pytest.mark.slow
def test_a_cpu_manifest_tuned_here_names_no_cuda_and_counts_its_tuning_time(
    server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """It said "not tuning cuda jobs here: no cuda device is visible" for TVM keys, and its
    last line read "0s 1/1 done" after minutes of tuning (follow() started its own clock)."""
    clock, tune_here = _Clock(), pretune._tune_here

    def slow_tune_here(*args: Any) -> None:  # the tuning, as if it took TUNED_FOR seconds
        tune_here(*args)
        clock.ahead += TUNED_FOR

    monkeypatch.setattr(pretune, "time", clock)
    monkeypatch.setattr(pretune, "_tune_here", slow_tune_here)
    manifest = tmp_path / "cpu.toml"
    manifest.write_text(CPU_MANIFEST)
    code = main(["pretune", str(manifest), "--server", server.url, "--local", "--trials", "1"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "cuda" not in err.lower(), err
    last = err.strip().splitlines()[-1]
    shown = re.match(r"\s*(\d+)s 1/1 done", last)
    assert shown is not None and float(shown.group(1)) >= TUNED_FOR, last


def test_a_manifest_of_gpu_keys_still_says_why_they_are_not_tuned_here(
    server: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a GPU, the CUDA keys are left queued, with the one line that says why."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: its keys are tuned here")
    manifest = tmp_path / "gpu.toml"
    manifest.write_text('arch = "sm_90"\n[[tune]]\nkernel = "softmax"\nbackends = ["triton"]\n'
                        "shapes = [{M = 8, N = 8}]\n")  # fmt: skip
    code = main(["pretune", str(manifest), "--server", server.url, "--local", "--no-wait"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert err.count("not tuning cuda jobs here") == 1 and "not tuning cpu" not in err, err
