"""docs/integrations.md's and docs/cli.md's examples, run as a newcomer runs them: each code block
written to the file it names, each ``$ tunecache …`` line run with the installed ``tunecache``
command from the folder holding them, against a real server (docs/cli.md's console blocks as one
bash script each, as pasted into a shell). An example that stops working fails here.

Only what a block leaves open is supplied: the values a production snippet takes from the code
around it (``model``, ``x``) and the server's address. The blocks that need a
GPU are run by their own tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cache_server.embedded import free_port
from tests.conftest import LiveServer

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "integrations.md").read_text()
CLI = (ROOT / "docs" / "cli.md").read_text()
TUNECACHE = Path(sys.executable).with_name("tunecache")  # the command the install made


def block(marker: str, lang: str = "python", doc: str = DOC) -> str:
    """The page's one ```lang block that contains ``marker`` (docs/integrations.md's unless
    ``doc`` is another's)."""
    found = [b for b in re.findall(rf"```{lang}\n(.*?)```", doc, flags=re.S) if marker in b]
    assert len(found) == 1, f"{len(found)} {lang} blocks of the page hold {marker!r}"
    return found[0]


def commands(marker: str) -> list[list[str]]:
    """The ``$ tunecache …`` lines of the console block that contains ``marker``, as argv."""
    lines = block(marker, "console").splitlines()
    return [line[2:].split() for line in lines if line.startswith("$ tunecache ")]


def console(marker: str) -> tuple[list[str], list[str]]:
    """docs/cli.md's console block holding ``marker``: the lines typed (comments left to bash;
    ``vllm serve``, another program, left out) and the output lines it shows."""
    lines = block(marker, "console", CLI).splitlines()
    typed = [line[2:] for line in lines if line.startswith("$ ")]
    assert all("tunecache" in line or " vllm serve " in line for line in typed), typed
    return [line for line in typed if " vllm serve " not in line], [
        line for line in lines if not line.startswith("$ ")
    ]


# Before the line after ``tunecache serve &``: what a newcomer's pause gives the server.
_UP = (
    "import os, sys, time, urllib.request\n"
    "for _ in range(600):\n"
    "    try:\n"
    "        urllib.request.urlopen(os.environ['TUNECACHE_URL'] + '/health', timeout=1)\n"
    "        sys.exit(0)\n"
    "    except OSError:\n"
    "        time.sleep(0.1)\n"
    "sys.exit('the server did not answer /health within a minute')"
)


def shell(typed: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    """``typed`` as one bash script in ``cwd``, stopping at the first command that fails; its
    output as a terminal shows it (stdout and stderr in one), or a failure showing it. What runs
    in the background (``&``) logs to a file of its own (shown on a failure) and is stopped at
    the end, with everything else the script started, whatever happens."""
    script = ["set -euo pipefail"]
    for n, line in enumerate(typed):
        command, _, comment = line.partition("  #")
        if command.rstrip().endswith("&"):  # its log would interleave with what is shown
            command = f"{command.rstrip()[:-1]} >background-{n}.log 2>&1 &"
        script.append(f"{command}  #{comment}" if comment else command)
        if command.startswith("tunecache serve "):
            script.append(f"{shlex.quote(sys.executable)} -c {shlex.quote(_UP)}")
    env = {**env, "PATH": f"{TUNECACHE.parent}{os.pathsep}{env.get('PATH', '')}"}
    process = subprocess.Popen(["bash", "-c", "\n".join(script)], cwd=cwd, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)  # fmt: skip
    try:
        out, _ = process.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)  # the server, the daemon: its whole group
        process.wait()
    logs = "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}"
                   for p in sorted(cwd.glob("background-*.log")))  # fmt: skip
    assert process.returncode == 0, f"{script}\n{out[-6000:]}{logs}"
    return out


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


def test_the_install_example_routes_the_librarys_kernels(tmp_path: Path) -> None:
    pytest.importorskip("fla")
    code = block("tunecache.triton.install(")
    env = {**os.environ, "TRITON_INTERPRET": "1"}  # a process of its own: it patches Triton
    env.pop("TUNECACHE_TRITON_AUTOTUNE", None)  # installed by the code, not by the variable
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    routed, _ = done.stdout.split(" kernels routed")
    assert int(routed.split()[-1]) > 0, done.stdout  # `import fla` alone routed none


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


@pytest.mark.slow
def test_your_own_tvm_module_tunes_and_a_process_compiles_with_its_schedule(
    server: LiveServer, tmp_path: Path
) -> None:
    pytest.importorskip("tvm")
    source = block("def matmul_bias()")
    assert source.startswith("# kernels.py\n")
    (tmp_path / "kernels.py").write_text(source)
    [tune] = commands("tunecache tune --tvm kernels.py:matmul_bias")
    tune[tune.index("--trials") + 1] = "8"  # the documented 64, fewer: a test's minute
    run(tune, tmp_path, server.url)
    check = "\nprint(sch is not None, type(lib).__name__)\n"
    out = run_python(block("tunecache.tvm.Database(") + check, tmp_path, server.url)  # as written
    assert out.split()[-2] == "True", out  # the team's schedule was served and built


def test_the_tvm_run_time_snippet_runs_as_written_with_no_server(tmp_path: Path) -> None:
    """The snippet, copied exactly beside the page's kernels.py, with no server up: TVM's default
    schedule, built (it once passed the factory function itself to ``compile_tir``)."""
    pytest.importorskip("tvm")
    (tmp_path / "kernels.py").write_text(block("def matmul_bias()"))
    check = "\nprint(sch is None, type(lib).__name__)\n"
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens: a server that is down
    out = run_python(block("tunecache.tvm.Database(") + check, tmp_path, down, timeout=120)
    assert out.split()[-2] == "True", out


@pytest.mark.slow
def test_the_cli_pages_first_example_serves_what_it_tuned(tmp_path: Path) -> None:
    typed, _ = console("tunecache serve &")
    assert typed[0].startswith("tunecache serve &") and "token create --db" in typed[1]
    typed = [line.replace("--trials 64", "--trials 8") for line in typed]  # a test's minute
    port = free_port()
    # A newcomer's machine: no token yet, the default database in the user's cache folder.
    env = environment(tmp_path, f"http://127.0.0.1:{port}")
    for held in ("TUNECACHE_TOKEN", "TUNECACHE_SERVER_BOOTSTRAP_TOKEN"):
        env.pop(held, None)
    out = shell(typed, tmp_path, {**env, "TUNECACHE_SERVER_PORT": str(port)})
    served = json.loads(out[out.index("\n{\n") + 1 :])  # get --json: the last thing printed
    assert served["hit"] is True and served["match"] == "exact", served
    assert served["record"]["key"]["backend"] == "tvm"


def test_the_vllm_moe_example_prints_what_the_page_shows(server: LiveServer,
                                                         tmp_path: Path) -> None:  # fmt: skip
    typed, shown = console("tunecache import vllm-moe")
    shutil.copytree(ROOT / "tests" / "fixtures", tmp_path / "tests" / "fixtures")
    out = shell(typed, tmp_path, environment(tmp_path, server.url))
    assert out.replace(server.url, "http://127.0.0.1:8765").splitlines() == shown
    assert sorted(p.name for p in (tmp_path / "moe-configs").iterdir()) == [
        "E=128,N=384,device_name=NVIDIA_H200.json"
    ]


@pytest.mark.slow
def test_the_cpu_pretune_example_ends_with_every_key_tuned(server: LiveServer,
                                                           tmp_path: Path) -> None:  # fmt: skip
    pytest.importorskip("tvm")
    manifest = block("# cpu.toml", "toml", CLI)
    (tmp_path / "cpu.toml").write_text(manifest)
    typed, shown = console("tunecache coverage cpu.toml")
    out = shell(typed, tmp_path, environment(tmp_path, server.url))
    assert shown[-1] in out.splitlines(), out  # the tally (the table names this machine's arch)


@pytest.mark.slow
def test_the_cancel_example_cancels_what_it_queued(server: LiveServer, tmp_path: Path) -> None:
    (tmp_path / "cpu.toml").write_text(block("# cpu.toml", "toml", CLI))
    typed, shown = console("tunecache pretune cpu.toml --cancel")
    out = shell(typed, tmp_path, environment(tmp_path, server.url)).splitlines()
    assert [line for line in shown if line in out] == shown, out  # each line as the page shows


@pytest.mark.slow
def test_the_best_example_ranks_the_backends_it_tuned(server: LiveServer, tmp_path: Path) -> None:
    pytest.importorskip("tvm")
    typed, shown = console("tunecache best matmul")
    out = shell(typed, tmp_path, environment(tmp_path, server.url)).splitlines()
    head = out.index(next(line for line in out if line.startswith("matmul M=64,N=64,K=64")))
    assert out[head].startswith("matmul M=64,N=64,K=64 float32: fastest is "), out
    assert out[head + 1].split() == shown[1].split()  # the table's header
    ranked = {line.split()[0] for line in out[head + 3 :] if line.split()}
    assert {"tvm", "inductor"} <= ranked, out
