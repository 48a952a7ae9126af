"""A user's kernel that is broken in its own code is named in one line, never an internal error:
a subclass that leaves ``flops`` / ``reference`` abstract is bad input (exit 2) where the kernel
is resolved, and a ``tvm_compute`` that raises fails the tune (exit 1) the way a ``torch_fn``
that raises does on Inductor."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tunecache.errors import InvalidInput, TuningError
from workloads import get_workload

PACKAGE = "user_errors_pkg"
KERNELS = """
    from workloads import Workload


    class NoRef(Workload):
        params = ("M",)
        inputs = (("M",),)
        output = ("M",)
        backend_dtypes = {"inductor": ("float32",)}

        def torch_fn(self, x):
            return x + 1


    class NoFlops(NoRef):
        def reference(self, x):
            return x.double() + 1


    class Base(Workload):
        params = ("M",)
        inputs = (("M",),)
        output = ("M",)
        backend_dtypes = {"inductor": ("float32",)}

        @abc.abstractmethod
        def scale(self): ...

        def torch_fn(self, x):
            return x * self.scale()

        def reference(self, x):
            return x.double() * self.scale()

        def flops(self, p):
            return p["M"]


    class NoScale(Base):
        pass


    class Raises(Workload):
        params = ("M", "N")
        inputs = (("M", "N"),)
        output = ("M", "N")
        backend_dtypes = {"inductor": ("float32",), "tvm": ("float32",)}

        def torch_fn(self, x):
            return x * 2.0

        def reference(self, x):
            return x.double() * 2.0

        def flops(self, p):
            return p["M"] * p["N"]

        def tvm_compute(self, problem, dtype):
            raise RuntimeError("my tvm compute is broken\\nsecond line")


    class NotTensors(Raises):
        def tvm_compute(self, problem, dtype):
            return ["not", "tensors"]


    class WrongDtype(Raises):
        def tvm_compute(self, problem, dtype):
            from tunecache.errors import InvalidInput

            raise InvalidInput(f"no {dtype} here")
"""


def _write_package(root: Path) -> None:
    package = root / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "kernels.py").write_text("import abc\n" + textwrap.dedent(KERNELS))


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    _write_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith(PACKAGE)]:
        del sys.modules[name]


def _tune(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cwd / "cache")}
    return subprocess.run([sys.executable, "-m", "tunecache_cli", "tune", *argv, "--no-upload"],
                          capture_output=True, text=True, timeout=300, cwd=cwd, env=env)  # fmt: skip


def _one_clear_line(done: subprocess.CompletedProcess[str]) -> str:
    """The last line of stderr, checked to be the only ``tunecache:`` line, with no traceback
    and no internal error anywhere."""
    out = done.stderr + done.stdout
    assert "Traceback" not in out and "internal error" not in out, out
    said = [line for line in done.stderr.splitlines() if line.startswith("tunecache:")]
    assert len(said) == 1 and done.stderr.strip().splitlines()[-1] == said[0], out
    return said[0]


@pytest.mark.parametrize(
    ("name", "missing"),
    [
        ("NoRef", "flops() and reference() (abstract in workloads.base.Workload)"),
        ("NoFlops", "flops() (abstract in workloads.base.Workload)"),
        ("NoScale", f"scale() (abstract in {PACKAGE}.kernels.Base)"),
    ],
)
def test_a_subclass_leaving_methods_abstract_is_named_with_them(
    package: Path, name: str, missing: str
) -> None:
    ref = f"{PACKAGE}.kernels:{name}"
    with pytest.raises(InvalidInput) as raised:
        get_workload(ref)
    assert str(raised.value) == f"{ref} must define {missing}"


def test_tune_of_a_subclass_leaving_methods_abstract_is_exit_2(tmp_path: Path) -> None:
    _write_package(tmp_path)
    done = _tune(tmp_path, f"{PACKAGE}.kernels:NoRef", "--backend", "inductor", "--shape", "M=8")
    assert done.returncode == 2, done.stderr
    assert _one_clear_line(done) == (
        f"tunecache: error: {PACKAGE}.kernels:NoRef must define flops() and reference() "
        "(abstract in workloads.base.Workload)"
    )


def test_tvm_compute_that_raises_is_a_tuning_error_naming_it(package: Path) -> None:
    pytest.importorskip("tvm")
    from backends.tvm.backend import TVMBackend

    ref = f"{PACKAGE}.kernels:Raises"
    with pytest.raises(TuningError) as raised:
        TVMBackend._prim_func(get_workload(ref), {"M": 8, "N": 24}, "float32")
    assert str(raised.value) == f"{ref}: tvm_compute raised RuntimeError: my tvm compute is broken"
    assert isinstance(raised.value.__cause__, RuntimeError)


def test_tvm_compute_returning_no_tensors_is_a_tuning_error_naming_it(package: Path) -> None:
    # an internal error (a TypeError from TVM) before: the CLI's exit 1 with "internal error",
    # and the end of a daemon that claimed a job of it
    pytest.importorskip("tvm")
    from backends.tvm.backend import TVMBackend

    ref = f"{PACKAGE}.kernels:NotTensors"
    with pytest.raises(TuningError) as raised:
        TVMBackend._prim_func(get_workload(ref), {"M": 8, "N": 24}, "float32")
    assert str(raised.value).startswith(
        f"{ref}: tvm_compute returned what TVM makes no PrimFunc of (its placeholders, then its "
        "output): TypeError: "
    )


def test_tvm_compute_raising_our_own_error_passes_it_on(package: Path) -> None:
    pytest.importorskip("tvm")
    from backends.tvm.backend import TVMBackend

    workload = get_workload(f"{PACKAGE}.kernels:WrongDtype")
    with pytest.raises(InvalidInput, match=r"^no float32 here$"):
        TVMBackend._prim_func(workload, {"M": 8, "N": 24}, "float32")


@pytest.mark.slow
def test_tune_of_a_tvm_compute_that_raises_says_so_as_inductor_does(tmp_path: Path) -> None:
    pytest.importorskip("tvm")
    _write_package(tmp_path)
    ref = f"{PACKAGE}.kernels:Raises"
    done = _tune(tmp_path, ref, "--backend", "tvm", "--shape", "M=8,N=24", "--trials", "2",
                 "--workers", "1")  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert _one_clear_line(done) == (
        f"tunecache: tuning failed: {ref}: tvm_compute raised RuntimeError: "
        "my tvm compute is broken"
    )


def test_a_strategy_asked_of_a_kernel_with_no_space_names_the_kernel_and_its_search() -> None:
    """``--strategy exhaustive`` on a user's TVM kernel with no knob space said "tvm has no
    enumerable space", where the built-in TVM kernels have one: the kernel is named."""
    from backends import get_backend
    from tuner.candidates import enumerable_space

    kernel = get_workload("tests.user_kernels:AffineRows")
    with pytest.raises(InvalidInput) as refused:
        enumerable_space(get_backend("tvm"), kernel, {"M": 8, "N": 24}, "float32")
    assert str(refused.value) == (
        "tests.user_kernels:AffineRows has no config space of its own on tvm for a strategy to "
        "search: its search there is 'meta_schedule' (the strategy to ask for, or none)"
    )
