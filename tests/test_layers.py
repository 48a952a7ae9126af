"""The layers of pyproject.toml's ``[tool.importlinter]``: kept by the code, and broken by a
deliberate wrong import (so the contracts are not vacuous)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tunecache_cli", "tuner", "cache_server", "backends", "workloads", "tunecache")
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache"],
                          cwd=root, env={"PYTHONPATH": str(root), "PATH": ""},
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the packages and the contracts, to break."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_code_keeps_the_layers(tree: Path) -> None:
    done = lint(tree)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 kept, 0 broken" in done.stdout


def test_the_run_time_library_importing_the_tuner_breaks_them(tree: Path) -> None:
    (tree / "tunecache" / "sneaky.py").write_text("from tuner import tune\n")
    done = lint(tree)
    assert done.returncode != 0
    assert "tunecache.sneaky -> tuner" in done.stdout and "1 kept, 1 broken" in done.stdout


def test_a_kernel_importing_a_backend_breaks_them(tree: Path) -> None:
    kit = tree / "workloads" / "triton_kit" / "jit.py"
    kit.write_text(kit.read_text() + "\n\ndef _backend() -> object:\n"
                   "    from backends.triton import TritonBackend\n\n    return TritonBackend\n")  # fmt: skip
    done = lint(tree)
    assert done.returncode != 0 and "workloads.triton_kit.jit -> backends.triton" in done.stdout


def test_a_cycle_inside_a_package_breaks_them(tree: Path) -> None:
    problem = tree / "tunecache" / "problem.py"  # a leaf that keys import
    problem.write_text(problem.read_text() + "\n\ndef _key() -> object:\n"
                       "    from tunecache.key import Key\n\n    return Key\n")  # fmt: skip
    done = lint(tree)
    assert done.returncode != 0
    assert "No cycles are allowed in tunecache" in done.stdout
