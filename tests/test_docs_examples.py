"""docs/integrations.md's examples, run as a newcomer runs them: each code block written to the
file it names, each ``$ tunecache …`` line run with the installed ``tunecache`` command from the
folder holding them, against a real server. An example that stops working fails here.

Only what a block leaves open is supplied: the values a production snippet takes from the code
around it (``model``, ``x``, ``matmul_bias``) and the server's address. The blocks that need a
GPU or a third-party library (``import fla``) are run by their own tests.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import LiveServer

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "integrations.md").read_text()
TUNECACHE = Path(sys.executable).with_name("tunecache")  # the command the install made


def block(marker: str, lang: str = "python") -> str:
    """The docs' one ```lang block that contains ``marker``."""
    found = [b for b in re.findall(rf"```{lang}\n(.*?)```", DOC, flags=re.S) if marker in b]
    assert len(found) == 1, f"{len(found)} {lang} blocks in docs/integrations.md hold {marker!r}"
    return found[0]


def commands(marker: str) -> list[list[str]]:
    """The ``$ tunecache …`` lines of the console block that contains ``marker``, as argv."""
    lines = block(marker, "console").splitlines()
    return [line[2:].split() for line in lines if line.startswith("$ tunecache ")]


def environment(cwd: Path, url: str) -> dict[str, str]:
    """This process's environment, with the server's address and every cache in ``cwd`` (a
    user's cache folder holds earlier tunes' MetaSchedule records, Inductor's choices)."""
    return {**os.environ, "TUNECACHE_URL": url, "XDG_CACHE_HOME": str(cwd / ".cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(cwd / ".inductor")}  # fmt: skip


def run(argv: list[str], cwd: Path, url: str, timeout: float = 600) -> str:
    """Runs one documented command from ``cwd``; its output, or a failure showing it."""
    assert argv[0] == "tunecache"
    assert TUNECACHE.exists(), f"no {TUNECACHE}: install the package (pip install -e .)"
    env = environment(cwd, url)
    done = subprocess.run([str(TUNECACHE), *argv[1:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, f"$ {' '.join(argv)}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def run_python(code: str, cwd: Path, url: str, timeout: float = 600) -> str:
    """Runs ``code`` as a script in ``cwd`` (where the example's files are); its output."""
    env = {**environment(cwd, url), "TORCHINDUCTOR_CACHE_DIR": str(cwd / ".fresh")}
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, f"{code}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


def test_the_triton_decorator_example_makes_a_tunecache_autotuner(tmp_path: Path) -> None:
    code = block("@tunecache.triton.autotune(") + (
        "\nfrom tunecache.triton.autotuner import CachedAutotuner"
        "\nassert isinstance(affine, CachedAutotuner), type(affine)"
        "\nprint(len(affine.configs), affine.keys)"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}  # a process of its own: the interpreter leaks
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["6", "['n']"]


@pytest.mark.slow
def test_your_own_kernel_tunes_and_is_served_as_documented(server: LiveServer,
                                                           tmp_path: Path) -> None:  # fmt: skip
    source = block("class AffineRows(Workload)")
    assert source.startswith("# mypkg/kernels.py\n")
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "kernels.py").write_text(source)
    tune, get = commands("mypkg.kernels:AffineRows")
    assert (tune[1], get[1]) == ("tune", "get")
    run(tune, tmp_path, server.url)
    served = run(get, tmp_path, server.url)
    assert "mypkg.kernels:AffineRows" in served and "inductor" in served, served


@pytest.mark.slow
def test_your_own_torch_code_pretunes_and_a_fresh_process_compiles_with_it(
    server: LiveServer, tmp_path: Path
) -> None:
    source = block("class Model(nn.Module)")
    assert source.startswith("# model.py\n")
    (tmp_path / "model.py").write_text(source)
    [tune] = commands("tunecache tune --torch model.py:Model")
    out = run(tune, tmp_path, server.url)
    assert "compiled with max-autotune" in out and "uploaded" in out, out
    # What the production snippet takes from the code around it: the model and its input.
    given = (
        "from model import Model, get_inputs, get_init_inputs\n"
        "model = Model(*get_init_inputs()).eval()\n"
        "[x] = get_inputs()\n"
    )
    check = "\nprint(float((y - model(x)).abs().max()))\n"
    error = run_python(given + block("tunecache.inductor.enable()") + check, tmp_path, server.url)
    assert float(error.split()[-1]) < 1e-4


MATMUL_BIAS = """
from tvm import te


def matmul_bias():
    a = te.placeholder((32, 32), name="A", dtype="float32")
    b = te.placeholder((32, 32), name="B", dtype="float32")
    bias = te.placeholder((32,), name="bias", dtype="float32")
    k = te.reduce_axis((0, 32), name="k")
    c = te.compute((32, 32), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    out = te.compute((32, 32), lambda i, j: c[i, j] + bias[j], name="out")
    return te.create_prim_func([a, b, bias, out])
"""


@pytest.mark.slow
def test_your_own_tvm_module_tunes_and_a_process_compiles_with_its_schedule(
    server: LiveServer, tmp_path: Path
) -> None:
    pytest.importorskip("tvm")
    (tmp_path / "kernels.py").write_text(MATMUL_BIAS)
    [tune] = commands("tunecache tune --tvm kernels.py:matmul_bias")
    tune[tune.index("--trials") + 1] = "8"  # the documented 64, fewer: a test's minute
    run(tune, tmp_path, server.url)
    given = "from kernels import matmul_bias as make\nmatmul_bias = make()\n"
    check = "\nprint(sch is not None, type(lib).__name__)\n"
    out = run_python(given + block("tunecache.tvm.Database(") + check, tmp_path, server.url)
    assert out.split()[-2] == "True", out  # the team's schedule was served and built
