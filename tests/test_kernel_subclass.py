"""A user's Workload subclass that inherits ``params`` and overrides only its computation is a
kernel of its own: its own name, key and compute (it once loaded as its parent, whose name the
error then told the user to use: tuning the parent's compute)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.factories import AFFINE_TVM_BODY
from tunecache.kernels import get_kernel
from workloads import get_workload

KERNELS = f"""
from workloads import Workload


class Affine(Workload):
{AFFINE_TVM_BODY}

    def tvm_compute(self, problem, dtype):
        return "the parent's compute"


class Shifted(Affine):
    def tvm_compute(self, problem, dtype):
        return "the subclass's compute"
"""


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    package = tmp_path / "subclass_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "kernels.py").write_text(KERNELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "subclass_pkg.kernels"
    for name in [n for n in sys.modules if n.startswith("subclass_pkg")]:
        del sys.modules[name]


def test_a_subclass_overriding_only_its_compute_is_its_own_kernel(module: str) -> None:
    parent, child = get_kernel(f"{module}:Affine"), get_kernel(f"{module}:Shifted")
    assert child.name == f"{module}:Shifted" and parent.name == f"{module}:Affine"
    assert child.params == parent.params and child.dtypes == parent.dtypes
    assert child.source_hash("tvm") == parent.source_hash("tvm")  # one file: names tell apart
    workload = get_workload(f"{module}:Shifted")
    assert workload.spec is child
    assert workload.tvm_compute({"M": 4, "N": 4}, "float32") == "the subclass's compute"


def test_a_builtins_subclass_stays_the_builtin() -> None:
    """Its backends' hooks live beside the built-in (``workloads/matmul/``), not beside a user's
    module: made a kernel of its own, it had none to tune with."""
    from workloads.matmul import Matmul

    class Mine(Matmul):
        pass

    assert Mine.spec.name == "matmul" and Mine.spec is Matmul.spec
