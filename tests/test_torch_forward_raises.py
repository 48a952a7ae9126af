"""``tune --torch`` on a model whose own forward raises: bad input (exit 2), said as running the
model, not compiling it; nothing is compiled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunecache_cli import main as cli_main

MODEL = """
import torch
from torch import nn


class Raises(nn.Module):
    def forward(self, x):
        raise ValueError("my forward is broken")


def get_inputs():
    return [torch.randn(4, 8)]
"""


def test_a_forward_that_raises_is_bad_input_not_a_failed_compile(
    tmp_path: Path, capsys: Any
) -> None:
    path = tmp_path / "mymodel.py"
    path.write_text(MODEL)
    assert cli_main(["tune", "--torch", f"{path}:Raises", "--no-upload"]) == 2
    err = capsys.readouterr().err
    assert "running" in err and "ValueError: my forward is broken" in err
    assert "compiling" not in err


NEEDS_ARGUMENTS = """
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.linear = nn.Linear(d, d)

    def forward(self, x):
        return self.linear(x)


def get_inputs():
    return [torch.randn(4, 8)]
"""


def test_a_module_whose_file_has_no_init_inputs_is_told_so(tmp_path: Path, capsys: Any) -> None:
    """It blamed ``Model(*get_init_inputs())``, a function the file does not have."""
    path = tmp_path / "needs.py"
    path.write_text(NEEDS_ARGUMENTS)
    assert cli_main(["tune", "--torch", f"{path}:Model", "--no-upload"]) == 2
    err = capsys.readouterr().err
    assert "Model() (needs.py has no get_init_inputs() to give its arguments) failed" in err, err
    assert err.rstrip().endswith(
        "(its arguments another function's of the file? --init-inputs NAME)"
    )


def test_init_inputs_given_for_a_function_is_refused(tmp_path: Path, capsys: Any) -> None:
    """``--init-inputs`` beside a function was accepted and never called: an option the form
    would not use is refused by name, never dropped without a word."""
    path = tmp_path / "fused.py"
    path.write_text("import torch\n\ndef fused(x):\n    return x * 2 + 1\n\n"
                    "def get_inputs():\n    return [torch.randn(4, 8)]\n")  # fmt: skip
    assert cli_main(["tune", "--torch", f"{path}:fused", "--init-inputs", "none",
                     "--no-upload"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "--init-inputs none goes with an nn.Module class; fused is no class" in err, err
