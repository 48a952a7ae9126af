"""Every subcommand, fed bad input, answers in one line with a documented exit code.

Exit codes: 0 ok or a hit, 1 a miss or a failed run, 2 bad input, 3 unreachable, 4 refused
(401 / 403), 130 interrupted. A "Traceback" anywhere fails the table.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEAD = "http://127.0.0.1:9"
KEY = ["--backend", "tvm", "--shape", "M=8,N=8,K=8"]

# (argv, exit code, words the one line must hold); {tmp} is a fresh folder, {busy} a port in use.
TABLE: list[tuple[list[str], int, str]] = [
    (["db", "upgrade", "--db", "postgresql://nobody:pw@127.0.0.1:1/x"], 2, "cannot upgrade"),
    (["db", "upgrade", "--db", "sqlite:////proc/tunecache.db"], 2, "unable to open database"),
    (["db", "upgrade", "--db", "mysql://x/y"], 2, "sqlite://, postgresql:// or postgres://"),
    (["serve", "--db", "sqlite:////proc/tunecache.db"], 2, "cannot open"),
    (["serve", "--db", "sqlite:///{tmp}/c.db", "--port", "{busy}"], 2, "cannot listen on"),
    (["serve", "--port", "70000"], 2, "bad server setting: --port: "),
    (["serve", "--db", "{tmp}/c.db"], 2, "postgres:// (a SQLite file: sqlite:///{tmp}/c.db)"),
    (
        [
            "token",
            "create",
            "--name",
            "x",
            "--scope",
            "read",
            "--db",
            "sqlite:////proc/tunecache.db",
        ],
        2,
        "cannot use the database",
    ),
    (["token", "list", "--db", "sqlite:////proc/tunecache.db"], 2, "there is no database at"),
    (["token", "create", "--name", "x", "--scope", "root", "--db"], 2, "--scope"),
    (
        ["token", "create", "--name", "x", "--scope", "read", "--db", "sqlite:///{tmp}/no/x.db"],
        2,
        "folder {tmp}/no does not exist",
    ),
    (
        ["token", "create", "--name", "x", "--scope", "read", "--db", "sqlite:////etc/passwd/x.db"],
        2,
        "/etc/passwd is not a folder",
    ),
    (["serve", "--db", "sqlite:///{tmp}/no/x.db"], 2, "does not exist"),
    (
        ["serve", "--db", "sqlite:///no/x.db"],
        2,
        "absolute one takes four slashes, sqlite:////no/x.db",
    ),
    (["db", "upgrade", "--db", "sqlite:///{tmp}/no/x.db"], 2, "does not exist"),
    (["tune", "matmul", *KEY, "--trials", "0", "--no-upload"], 2, "trials"),
    (["tune", "matmul", *KEY, "--seconds", "-1", "--no-upload"], 2, "seconds"),
    (
        ["tune", "matmul", *KEY, "--seconds", "nan", "--no-upload"],
        2,
        "--seconds must be a positive",
    ),
    # a record holds at most 1e8 seconds; 1e308 was an internal error after the whole search
    (["tune", "matmul", *KEY, "--seconds", "1e308", "--no-upload"], 2, "at most 1e+08 seconds"),
    (["daemon", "--job-seconds", "1e9"], 2, "--job-seconds 1e+09: at most 1e+08 seconds"),
    (["tune", "matmul", *KEY, "--workers", "0", "--no-upload"], 2, "--workers must be at least 1"),
    (["tune", "matmul", *KEY, "--workers", "-2", "--no-upload"], 2, "--workers must be at least 1"),
    (
        ["tune", "matmul", *KEY, "--patience", "0", "--no-upload"],
        2,
        "--patience must be at least 1",
    ),
    (
        ["tune", "matmul", *KEY, "--trials", "-5", "--no-upload"],
        2,
        "--trials must be 1 to 1000000, not -5",
    ),
    (["tune", "matmul", *KEY, "--seed", "-1", "--no-upload"], 2, "--seed must be 0 to 4294967295"),
    (["tune", "--tvm", "{tmp}/garbage.py:f", "--workers", "0"], 2, "--workers must be at least 1"),
    # An option the flow would ignore is named, never dropped without a word.
    (
        ["tune", "--tvm", "{tmp}/garbage.py:f", "--strategy", "random", "--seed", "3"],
        2,
        "tune --tvm does not use --strategy, --seed (MetaSchedule searches on its own, on this "
        "machine's cores): leave them out",
    ),
    (["tune", "--torch", "{tmp}/missing.py:M", "--patience", "4"], 2, "not use --patience ("),
    (["tune", "--torch", "{tmp}/missing.py:M", "--seed", "0"], 2, "not use --seed ("),
    (["tune", "matmul", *KEY, "--inputs", "make", "--no-upload"], 2, "not use --inputs (for"),
    (
        ["token", "list", "--server", "http://127.0.0.1:9", "--db", "sqlite:///{tmp}/t.db"],
        2,
        "give one of --server and --db",
    ),
    (
        ["tune", "matmul", *KEY, "--landscape", "{tmp}/no/l.json", "--no-upload"],
        2,
        "--landscape {tmp}/no/l.json: folder {tmp}/no does not exist",
    ),
    (
        ["tune", "matmul", *KEY, "--landscape", "{tmp}/l.json", "--trials", "8", "--no-upload"],
        2,
        "--landscape measures every config of the space, exhaustively: leave out --trials",
    ),
    (
        ["tune", "matmul", *KEY, "--landscape", "{tmp}/l.json", "--strategy", "random"],
        2,
        "leave out --strategy",
    ),
    (["records", "ls", "--backend", "cuda"], 2, "--backend 'cuda': expected one of triton, tvm"),
    (["records", "ls", "--dtype", "fp9"], 2, "--dtype 'fp9': expected one of"),
    (["records", "ls", "--dtype", "fp32"], 2, "(did you mean 'float32'?)"),
    (["records", "ls", "--backend", "tvmm"], 2, "(did you mean 'tvm'?)"),
    (["records", "ls", "--kernel", "a b"], 2, "--kernel 'a b': a name starts with a letter"),
    (["records", "show", "-1"], 2, "ID -1: a record ID is a whole number from 1 up"),
    (["records", "ls", "--limit", "0"], 2, "--limit must be 1 to 1000, not 0"),
    (["tune", "matmul", "--backend", "tvm", "--shape", "M=8,N=x,K=8"], 2, "not an integer"),
    (
        [
            "tune",
            "matmul",
            "--backend",
            "tvm",
            "--shape",
            "M=99999999,N=99999999,K=99999999",
            "--no-upload",
        ],
        2,
        "GiB: a smaller shape",
    ),
    (
        ["tune", "matmul", *KEY, "--server", DEAD],
        3,
        "uploading the result: the server is not answering",
    ),
    (["tune", "--torch", "{tmp}/missing.py:Model"], 2, "no Python file"),
    (["tune", "--tvm", "{tmp}/garbage.py:f"], 2, "importing"),
    (
        ["tune", "garbage:K", *KEY, "--no-upload"],
        2,
        "importing 'garbage' for kernel 'garbage:K' failed: SyntaxError",
    ),
    (["get", "garbage:K", *KEY, "--server", DEAD], 2, "failed: SyntaxError"),
    (["get", "matmul", *KEY, "--server", "http://[::1"], 2, "not a valid URL"),
    (["get", "matmul", *KEY, "--server", "ftp://x"], 2, "http://"),
    (["get", "matmul", *KEY, "--server", DEAD], 3, "Connect"),
    (["best", "matmul", "--shape", "M=8,N=8,K=8", "--server", DEAD], 3, "Connect"),
    (["best", "matmul", "--shape", "M=8"], 2, "matmul"),
    (["demo", "--trials", "0"], 2, "--trials must be 1 to 1000000, not 0"),
    (["demo", "--workloads", "nope"], 2, "unknown workload"),
    (["replay", "{tmp}/garbage.py"], 2, "cannot read landscape"),
    (["snapshot", "import", "{tmp}/garbage.py", "--server", DEAD], 2, "not a valid snapshot"),
    (["sync", "-o", "{tmp}/snap.json", "--server", DEAD], 3, "refused"),
    (["sync", "-o", "{tmp}/no/snap.json"], 2, "-o {tmp}/no/snap.json: folder {tmp}/no does not"),
    (["sync", "-o", "{tmp}"], 2, "is a folder: name a file in it"),
    (["sync", "--arch", ""], 2, "--arch '': expected a device arch"),  # it synced this machine's
    (["sync", "--arch", "sm 90", "-o", "{tmp}/held.json"], 2, "--arch 'sm 90': expected a device"),
    (
        ["snapshot", "export", "--arch", "cpu-avx2", "-o", "{tmp}/no/s.json"],
        2,
        "folder {tmp}/no does not exist",
    ),
    (["pretune", "{tmp}/garbage.py"], 2, "not TOML"),
    (["coverage", "{tmp}/missing.toml"], 2, "cannot read manifest"),
    (["daemon", "--trials", "0"], 2, "--trials must be 1 to 1000000, not 0"),
    (["daemon", "--workers", "0"], 2, "--workers must be at least 1, not 0"),
    (["daemon", "--workers", "100000"], 2, "--workers 100000: at most"),
    (["daemon", "--max-trials", "2000000"], 2, "--max-trials must be 1 to 1000000"),
    (["daemon", "--lease", "1e-300"], 2, "--lease 1e-300: at least 1 seconds"),
    (["daemon", "--poll", "0.001"], 2, "--poll 0.001: at least 0.1 seconds"),
    # 2**63 trials failed in TVM's C++ after the search had started (exit 1)
    (["tune", "matmul", *KEY, "--trials", str(2**63), "--no-upload"], 2, "must be 1 to 1000000"),
    (["pretune", "{tmp}/garbage.py", "--trials", "1000001"], 2, "--trials must be 1 to 1000000"),
    (["demo", "--trials", str(2**63)], 2, "--trials must be 1 to 1000000"),
    # Another database's URL was an internal error: its driver, missing (exit 1).
    (["demo", "--db", "mysql://x"], 2, "--db: database URL 'mysql://x' must be sqlite://"),
    (["tune", "matmul", *KEY, "--workers", "100000", "--no-upload"], 2, "the CPU cores this"),
    (["daemon", "--poll", "nan"], 2, "--poll must be a positive number of seconds"),
    (["daemon", "--lease", "-1"], 2, "--lease must be a positive number of seconds"),
    (["daemon", "--lease", "1e9"], 2, "--lease 1e+09: at most 86400 seconds"),
    (
        ["get", "matmul", "--backend", "triton", "--shape", "M=64"],
        2,
        "missing N, K",
    ),  # not "no GPU"
    (["pretune", "{tmp}/garbage.py", "--trials", "0"], 2, "--trials must be 1 to 1000000"),
    (["replay", "{tmp}/garbage.py", "--seed", "-1"], 2, "--seed must be 0 to 4294967295"),
    (["replay", "{tmp}/garbage.py", "--trials", "0"], 2, "--trials must be 1 to 1000000"),
    (["report", "-o", "/proc/tunecache-report", "--server", DEAD], 2, "cannot create"),
    (["workloads", "--nope"], 2, "unrecognized arguments"),
]


@pytest.fixture(scope="module")
def busy_port() -> object:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        yield held.getsockname()[1]


@pytest.mark.parametrize(("argv", "code", "says"), TABLE, ids=[" ".join(a[:2]) for a, *_ in TABLE])
def test_bad_input_is_one_line_and_a_documented_code(
    argv: list[str], code: int, says: str, tmp_path: Path, busy_port: int
) -> None:
    (tmp_path / "garbage.py").write_text("this is not python, json or toml: {]\n")
    argv = [a.format(tmp=tmp_path, busy=busy_port) for a in argv]
    env = {**os.environ, "TUNECACHE_TOKEN": "tc_" + "3" * 43, "TUNECACHE_URL": DEAD}
    done = subprocess.run([sys.executable, "-m", "tunecache_cli", *argv], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=env)  # fmt: skip
    err = done.stderr.strip()
    assert "Traceback" not in done.stderr + done.stdout, err
    assert done.returncode == code, err
    assert says.format(tmp=tmp_path) in err, err
    assert not (tmp_path / "no").exists()  # a mistyped database folder is never created
    assert len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    ("given", "url", "says"),
    [
        ("--server", "http://alice:hunter2@127.0.0.1:9", "holds a user name or password"),
        ("TUNECACHE_URL", "HTTP://alice:hunter2@127.0.0.1:9", "holds a user name or password"),
        ("--server", "http://alice:hunter2/x@127.0.0.1:9", "holds a user name or password"),
        ("TUNECACHE_URL", "http:/alice:hunter2@127.0.0.1:9", "must start with http://"),
        ("TUNECACHE_URL", "ftp://alice:hunter2@127.0.0.1:9", "must start with http://"),
    ],
)
def test_a_server_url_with_a_password_is_refused_without_showing_it(
    given: str, url: str, says: str, tmp_path: Path
) -> None:
    # httpx sends a URL's user and password as Basic auth in place of the token (the server
    # answered 401 to a token that was never sent), and every message naming the server showed
    # the password: a URL wrong in any way too.
    argv, env = ["get", "matmul", *KEY], {**os.environ, "TUNECACHE_URL": DEAD}
    if given == "--server":
        argv += ["--server", url]
    else:
        env["TUNECACHE_URL"] = url
    done = subprocess.run([sys.executable, "-m", "tunecache_cli", *argv], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=env)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "hunter2" not in done.stderr + done.stdout and "alice" not in done.stderr
    shown = url.replace("alice:hunter2/x@", "").replace("alice:hunter2@", "")
    shown = shown.replace("http:/", "") if shown.startswith("http:/1") else shown
    assert done.stderr.strip().startswith(
        f"tunecache: error: {given}{' ' if given == '--server' else '='}{shown!r} "
        f"(user and password left out here) {says}"
    ), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "env", "code"),
    [
        (["serve", "--db", "postgresql://u:hunter2@127.0.0.1:1/x", "--port", "{busy}"], {}, 2),
        (["serve", "--db", "mysql://u:hunter2@db/x"], {}, 2),
        (["db", "upgrade", "--db", "postgresql://u:hunter2@127.0.0.1:port/x"], {}, 2),
        (["records", "ls", "--server", DEAD], {"HTTPS_PROXY": "http://u:hunter2@proxy:bad"}, 3),
        (["records", "ls", "--server", DEAD], {"ALL_PROXY": "socks5://u:hunter2@proxy:1"}, 3),
    ],
    ids=["database refused", "database scheme", "database port", "proxy port", "socks proxy"],
)
def test_no_message_shows_a_password(
    argv: list[str], env: dict[str, str], code: int, tmp_path: Path, busy_port: int
) -> None:
    """A database's or a proxy's password, in a URL given for it, is never printed or logged:
    not when it is refused, malformed, or cannot be used (a bad proxy is left out, and said)."""
    argv = [a.format(busy=busy_port) for a in argv]
    done = subprocess.run([sys.executable, "-m", "tunecache_cli", *argv], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, **env})  # fmt: skip
    assert done.returncode == code, done.stderr
    assert "hunter2" not in done.stderr + done.stdout, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def test_server_overrides_a_bad_tunecache_url(tmp_path: Path) -> None:
    """``--server`` is the URL used: a malformed ``TUNECACHE_URL`` does not stop the command."""
    env = {**os.environ, "TUNECACHE_URL": "http://alice:hunter2@cache"}
    argv = ["get", "matmul", *KEY, "--server", DEAD]
    done = subprocess.run([sys.executable, "-m", "tunecache_cli", *argv], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=env)  # fmt: skip
    assert done.returncode == 3 and "127.0.0.1:9" in done.stderr, done.stderr  # not reachable
    assert "hunter2" not in done.stderr


def test_a_gpu_daemon_without_a_gpu_says_what_to_run_instead(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: a CUDA daemon may start here")
    done = subprocess.run([sys.executable, "-m", "tunecache_cli", "daemon", "--device", "cuda"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("tunecache: error: --device cuda: no CUDA device is visible "
                                   "here (CUDA_VISIBLE_DEVICES?); on a CPU machine, run a CPU "
                                   "daemon (--device cpu)")  # fmt: skip


def _start_cli(
    argv: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``tunecache ARGV`` in a process group of its own, as a terminal's foreground job: Ctrl-C
    (SIGINT) reaches it whatever this process inherited. A shell's background job (``cmd &``)
    ignores SIGINT, and an ignored signal stays ignored across ``exec``: started from such a test
    run, a child never saw the tests' Ctrl-C and ran on. A handled signal is reset to the
    default at ``exec``, so the child starts with Python's own handler."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen([sys.executable, "-m", "tunecache_cli", *argv], cwd=cwd,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, env=env)  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)


def _after_interrupt(process: subprocess.Popen[str], timeout: float) -> str:
    """What ``process`` says on stderr once it has stopped; one that does not stop within
    ``timeout`` is killed with its group (left running, it disturbs every later test)."""
    try:
        return process.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        err = process.communicate()[1]
        raise AssertionError(f"still running {timeout:g} s after Ctrl-C: {err[-2000:]}") from None


def test_ctrl_c_during_a_tune_is_exit_130_and_one_line(tmp_path: Path) -> None:
    argv = ["tune", "bias_gelu", "--backend", "tvm", "--shape", "M=64,N=64,K=64", "--strategy",
            "random", "--trials", "500", "--no-upload"]  # fmt: skip
    process = _start_cli(argv, tmp_path)
    assert process.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until the search is measuring candidates
        line = process.stderr.readline()
        seen.append(line)
        if "searching [" in line:
            break
    os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
    rest = _after_interrupt(process, 60)
    assert process.returncode == 130, rest
    assert "Traceback" not in rest and rest.strip().splitlines()[-1] == "tunecache: interrupted"


@pytest.mark.slow
def test_ctrl_c_during_metaschedule_is_exit_130_and_the_next_tune_works(tmp_path: Path) -> None:
    """Inside TVM's C++ search a KeyboardInterrupt crashed the process (a segfault, or
    ``'NoneType' object has no attribute 'kill'``), and TVM's workers printed tracebacks."""
    argv = ["tune", "softmax", "--backend", "tvm", "--shape", "M=256,N=256", "--trials", "32",
            "--no-upload"]  # fmt: skip
    process = _start_cli(argv, tmp_path)
    assert process.stderr is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if "meta_schedule: starting" in process.stderr.readline():
            break
    time.sleep(4)  # inside MetaSchedule: its workers importing TVM, or candidates building
    os.killpg(process.pid, signal.SIGINT)
    rest = _after_interrupt(process, 120)
    assert process.returncode == 130, rest
    assert "Traceback" not in rest and rest.strip().splitlines()[-1] == "tunecache: interrupted"
    again = subprocess.run([sys.executable, "-m", "tunecache_cli", *argv[:-3], "--trials", "4",
                            "--no-upload"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]


INDUCTOR_KEY = ["tune", "matmul", "--backend", "inductor", "--shape", "M=128,N=128,K=128",
                "--no-upload"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "phase"),
    [
        (INDUCTOR_KEY, "compiling with max-autotune"),  # Inductor's own search
        (INDUCTOR_KEY, "timing re-timing the search"),  # the re-timing of its best choices
        (INDUCTOR_KEY, "validating [0/"),  # the check against the float64 reference
        # a user's module: compile, check, time
        (
            ["tune", "--torch", "{model}:Model", "--device", "cpu", "--no-upload"],
            "compiling with max-autotune",
        ),
    ],
    ids=["inductor-search", "inductor-timing", "inductor-validating", "torch-compile"],
)
def test_ctrl_c_in_every_inductor_phase_is_exit_130_and_one_line(
    tmp_path: Path, argv: list[str], phase: str
) -> None:
    """The Triton backend's phases cannot run here (a key's tune refuses Triton's CPU
    interpreter up front); TVM's are the two tests above."""
    from tests.test_inductor_cache import write_model

    model = write_model(tmp_path / "model")
    argv = [a.format(model=model) for a in argv]
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # a cold compile
    process = _start_cli(argv, tmp_path, env)
    assert process.stderr is not None
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        assert line, f"{argv} ended before {phase!r}"
        if phase in line:
            break
    os.killpg(process.pid, signal.SIGINT)
    rest = _after_interrupt(process, 120)
    assert process.returncode == 130, rest
    assert "Traceback" not in rest and rest.strip().splitlines()[-1] == "tunecache: interrupted"


def test_sync_to_a_snapshot_variable_in_a_missing_folder_is_refused_not_made(
    tmp_path: Path,
) -> None:
    """``TUNECACHE_SNAPSHOT=/…/a/b/x.json tunecache sync`` made ``a/`` and ``a/b/`` and wrote
    there, exit 0, where ``-o`` into a missing folder is refused (a newcomer's walk): the
    variable's file is checked as ``-o``'s is, before the server is asked."""
    target = tmp_path / "no" / "deeper" / "snap.json"
    env = {**os.environ, "TUNECACHE_SNAPSHOT": str(target), "TUNECACHE_URL": DEAD}
    done = subprocess.run([sys.executable, "-m", "tunecache_cli", "sync"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=env)  # fmt: skip
    assert done.returncode == 2, done.stderr
    said = f"TUNECACHE_SNAPSHOT {target}: folder {target.parent} does not exist (create it first)"
    assert said in done.stderr and not (tmp_path / "no").exists()
