"""A user's TVM function with a dynamic shape is bad input, said in one line (exit 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tvm")

from tunecache_cli import main as cli_main

DYNAMIC = """
from tvm import te


def dyn():
    n = te.var("n")
    a = te.placeholder((n, 16), name="A", dtype="float32")
    b = te.compute((n, 16), lambda i, j: a[i, j] * 2.0, name="B")
    return te.create_prim_func([a, b])
"""


def test_a_dynamic_shape_names_the_buffer_and_dimension(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "dyn.py"
    path.write_text(DYNAMIC)
    assert cli_main(["tune", "--tvm", f"{path}:dyn", "--trials", "4", "--no-upload"]) == 2
    err = capsys.readouterr().err
    assert "internal error" not in err and "TypeError" not in err
    assert "buffers must have fixed shapes" in err
    assert "buffer 'A' has dimension 0 = n" in err
    assert len(err.strip().splitlines()) == 1


def test_the_reference_says_it_the_same_way(tmp_path: Path) -> None:
    import runpy

    from backends.tvm.database import normalize_module
    from backends.tvm.golden import arguments
    from tunecache.errors import InvalidInput

    path = tmp_path / "dyn.py"
    path.write_text(DYNAMIC)
    mod = normalize_module(runpy.run_path(str(path))["dyn"]())
    with pytest.raises(InvalidInput, match="buffer 'A' has dimension 0 = n"):
        arguments(mod)
