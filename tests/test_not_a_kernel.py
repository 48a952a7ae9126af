"""A function or torch module passed to ``tune`` as a KERNEL: the form of ``tune`` it takes,
without a memory address."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tunecache_cli import main as cli_main

SOURCE = """
def rowsum_scale():
    return "a TVM PrimFunc would be built here"
"""


def test_a_function_named_as_a_kernel_points_to_tvm_and_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    (tmp_path / "notkernel_mod.py").write_text(SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["tune", "notkernel_mod:rowsum_scale", "--backend", "tvm", "--shape", "M=1"]
    assert cli_main([*argv, "--no-upload"]) == 2
    err = capsys.readouterr().err
    assert "--tvm notkernel_mod.py:rowsum_scale" in err
    assert "--torch notkernel_mod.py:rowsum_scale" in err
    assert not re.search(r"0x[0-9a-f]{6,}", err), err


def test_as_spec_names_no_memory_address() -> None:
    from tunecache.errors import InvalidInput
    from tunecache.kernels import as_spec

    with pytest.raises(InvalidInput) as raised:
        as_spec(lambda: None)
    assert not re.search(r"0x[0-9a-f]{6,}", str(raised.value))
