"""An unusable ``TUNECACHE_WORK_DIR`` (its parent a file) is one line naming the variable and the
path, exit 2, as other unusable local paths are: it was ``internal error: NotADirectoryError``,
exit 1, once TVM's search had started. A tune says it before its first line, a daemon instead of
starting."""

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
    said = (done.stdout + done.stderr).strip().splitlines()
    assert len(said) == 1, said  # refused before the search says it started
    assert "TUNECACHE_WORK_DIR" in said[0] and str(under_a_file) in said[0], said
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr


def test_a_daemon_with_an_unusable_work_dir_does_not_start(under_a_file: Path) -> None:
    """It started, claimed jobs and failed each (its attempts spent on a setting of its own)."""
    env = {**os.environ, "TUNECACHE_WORK_DIR": str(under_a_file)}
    env.pop("TUNECACHE_TOKEN", None)
    done = subprocess.run(
        [sys.executable, "-m", "tunecache_cli", "daemon", "--device", "cpu", "--once",
         "--server", "http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    said = (done.stdout + done.stderr).strip().splitlines()
    assert len(said) == 1 and "TUNECACHE_WORK_DIR" in said[0], said
    assert str(under_a_file) in said[0], said
