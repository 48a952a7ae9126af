"""An unusable ``TUNECACHE_WORK_DIR`` (its parent a file) is one line naming the variable and the
path, exit 2, as other unusable local paths are: it was ``internal error: NotADirectoryError``,
exit 1, once TVM's search had started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunecache.errors import InvalidInput

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def under_a_file(tmp_path: Path) -> Path:
    (tmp_path / "notadir").write_text("a file\n")
    return tmp_path / "notadir" / "work"


def test_the_work_dir_is_made_or_refused_naming_the_variable(
    tmp_path: Path, under_a_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.tune import default_workdir

    monkeypatch.setenv("TUNECACHE_WORK_DIR", str(under_a_file))
    with pytest.raises(InvalidInput, match=f"TUNECACHE_WORK_DIR folder {under_a_file}: "):
        default_workdir()
    monkeypatch.setenv("TUNECACHE_WORK_DIR", str(tmp_path / "new" / "work"))
    assert default_workdir().is_dir()


def test_a_tune_with_an_unusable_work_dir_is_one_line_exit_2(under_a_file: Path) -> None:
    pytest.importorskip("tvm")
    env = {**os.environ, "TUNECACHE_WORK_DIR": str(under_a_file)}
    done = subprocess.run(
        [sys.executable, "-m", "tunecache_cli", "tune", "softmax", "--backend", "tvm",
         "--shape", "M=32,N=32", "--trials", "4", "--no-upload"],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "TUNECACHE_WORK_DIR" in last and str(under_a_file) in last, done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
