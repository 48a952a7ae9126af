"""The command line: bad input exits 2 with one line naming the problem and stores nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer
from tunecache.errors import InvalidInput
from tunecache.interleave import Compared, Ratio
from tunecache_cli.args import parse_shape


def tunecache(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tunecache_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


BAD = [
    (["tune", "conv2d", "--backend", "tvm", "--shape", "M=8"], "unknown kernel 'conv2d'"),
    (["get", "matmul", "--backend", "tvm", "--shpae", "M=8,N=8,K=8"], "unrecognized arguments: --shpae (the following arguments are required: --shape); --shpae: did you mean --shape?"),
    (["get", "matmul", "--back", "tvm"], "error: the following arguments are required: --shape"),  # --back is --backend
    # Said by the root parser, which has none of a command's options: the command's are offered
    (["tune", "matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=8", "--trails", "3"], "unrecognized arguments: --trails 3; --trails: did you mean --trials?"),
    (["gett", "matmul"], "invalid choice: 'gett'"),
    # the last --shape was tuned, without a word
    (["tune", "matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=8", "--shape", "M=9,N=8,K=8"], "--shape given twice: give it once"),
    (["gett", "matmul"], "gett: did you mean get?"),
    (["records", "lss"], "lss: did you mean ls?"),
    (["tune", "tests.no_such_module:K", "--backend", "tvm", "--shape", "M=8"], "cannot import 'tests.no_such_module'"),
    (["tune", "tests.factories:NoSuchKernel", "--backend", "tvm", "--shape", "M=8"], "has no 'NoSuchKernel'"),
    (["tune", "tests.factories:make_key", "--backend", "tvm", "--shape", "M=8"], "is a function, not a kernel (a Workload subclass or a KernelSpec): tune a TVM function with `--tvm tests/factories.py:make_key`"),
    (["tune", "tests.user_kernels:Undeclared", "--backend", "tvm", "--shape", "M=8"], "is a Workload subclass that declares no kernel: set its params"),
    (["tune", "tests.factories:CPU", "--backend", "tvm", "--shape", "M=8"], "is an object of type DeviceFingerprint, not a kernel"),
    (["snapshot", "export", "--arch", "cpu-avx2", "--backend", "tvmm", "-o", "/nonexistent/s.json"], "--backend 'tvmm': expected one of triton, tvm, inductor"),
    (["snapshot", "export", "--arch", "cpu-avx2", "--kernel", "a b", "-o", "/nonexistent/s.json"], "--kernel 'a b': a name starts with a letter"),
    (["report", "-o", "/tmp/tunecache-bad-filter-report", "--kernel", "a b"], "--kernel 'a b': a name starts with a letter"),
    (["report", "-o", "/tmp/tunecache-bad-filter-report", "--backend", "cuda"], "--backend 'cuda': expected one of triton, tvm, inductor"),
    (["tune", "_json:make_scanner", "--backend", "tvm", "--shape", "M=8"], "tune a TVM function with `--tvm FILE.py:make_scanner`"),
    (["tune", "torch.nn:Linear", "--backend", "tvm", "--shape", "M=8"], "is a torch module (torch.nn.Module), not a kernel (a Workload subclass or a KernelSpec): tune it with `--torch FILE.py:Linear`"),
    (["tune", "matmul", "--backend", "cudnn", "--shape", "M=8,N=8,K=8"], "not 'cudnn'"),
    (["tune", "matmul", "--backend", "tvm", "--dtype", "fp8", "--shape", "M=8,N=8,K=8"], "not 'fp8'"),
    (["tune", "matmul", "--backend", "tvm", "--shape", "M=8,N=8"], "missing K"),
    (["tune", "matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=x"], "K='x' is not an integer"),
    (["tune", "matmul", "--backend", "tvm", "--shape", "M8,N=8,K=8"], "malformed shape"),
    (["tune", "matmul", "--backend", "tvm", "--shape", "M=8 N=8 K=8"], "not an integer (sizes go apart with commas: M=64,N=64)"),
    (["tune", "matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=-8"], "must be positive"),
    (["tune", "matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=8", "--trials", "0"], "trials"),
    (["tune", "matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=8,Q=2"], "unknown Q"),
    (["get", "softmax", "--backend", "tvm", "--shape", "M=8,N=8,K=8"], "unknown K"),
    (["tune", "matmul", "--shape", "M=8,N=8,K=8"], "--backend"),
    (["tune", "matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=8", "--trials", "many"], "invalid int"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "message"), BAD)
def test_bad_input_exits_2_with_one_line_and_stores_nothing(
    shared_server: LiveServer, argv: list[str], message: str
) -> None:
    done = tunecache(*argv, "--server", shared_server.url)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert len([line for line in done.stderr.splitlines() if "error" in line]) == 1
    assert httpx.get(f"{shared_server.url}/health").json()["records"] == 0


def test_bad_server_url_is_exit_2() -> None:
    done = tunecache(
        "get", "matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=8", "--server", "ftp://x"
    )
    assert done.returncode == 2 and "http://" in done.stderr


def test_get_unreachable_server_is_exit_3() -> None:
    from cache_server.embedded import free_port

    url = f"http://127.0.0.1:{free_port()}"
    done = tunecache("get", "matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=8", "--server", url)
    assert done.returncode == 3 and "Connect" in done.stderr and "Traceback" not in done.stderr
    # Nothing listens there: said as the likely cause (it was errno 111 alone).
    for run in (done, tunecache("records", "ls", "--server", url)):
        assert run.stderr.rstrip().endswith("(is `tunecache serve` running there, and is the URL "
                                            "right?)"), run.stderr  # fmt: skip


def test_get_miss_is_exit_1(shared_server: LiveServer) -> None:
    done = tunecache("get", "matmul", "--backend", "inductor", "--shape", "M=8,N=8,K=8",
                     "--server", shared_server.url)  # fmt: skip
    assert done.returncode == 1 and done.stdout.startswith("miss: matmul")
    assert "--explain lists the records nearest this key" in done.stdout  # a hint, not a guess


def test_version_bare_help_and_workloads_json() -> None:
    version = tunecache("--version")
    assert version.returncode == 0 and version.stdout.startswith("tunecache ")
    bare = tunecache()
    assert bare.returncode == 0 and "usage: tunecache" in bare.stdout and "tune" in bare.stdout
    listed = json.loads(tunecache("workloads", "--json").stdout)
    assert {w["name"] for w in listed} >= {"matmul", "softmax", "layernorm", "rmsnorm"}
    assert listed[0]["backends"]["tvm"] == ["float32"]


def test_workloads_lists_every_workload() -> None:
    done = tunecache("workloads")
    assert done.returncode == 0
    for name, shape in [
        ("matmul", "M,N,K"),
        ("softmax", "M,N"),
        ("layernorm", "M,N"),
        ("bias_gelu", "M,N,K"),
    ]:
        assert any(line.split()[:2] == [name, shape] for line in done.stdout.splitlines())


def test_parse_shape() -> None:
    assert parse_shape(" M=4, N = 8 ") == {"M": 4, "N": 8}
    for bad in ("", "M", "M=", "=4", "M=4,M=5", "M=1.5"):
        with pytest.raises(InvalidInput):
            parse_shape(bad)


def test_get_json_prints_the_record(server: LiveServer) -> None:
    from tests.factories import make_record
    from tunecache import key_for
    from tunecache.client import Client

    key = key_for("matmul", "tvm", {"M": 8, "N": 8, "K": 8}, "float32")
    with Client(server.url) as client:
        client.upload(make_record(key, time_ms=0.5))
    done = tunecache("get", "matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=8", "--json",
                     "--server", server.url)  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["hit"], answer["match"], answer["policy"]) == (True, "exact", "strict")
    record = answer["record"]
    assert record["key"]["problem"] == {"K": 8, "M": 8, "N": 8}
    assert record["timing"]["median_ms"] == 0.5
    plain = tunecache("get", "matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=8",
                      "--server", server.url)  # fmt: skip
    assert plain.returncode == 0 and "2.00x faster than torch eager" in plain.stdout
    assert "matched    exact rule, strict version policy" in plain.stdout
    # M=7 is served M=8's record by the bucket rule: its header is the record's key, its
    # matched line the key asked for.
    bucketed = tunecache("get", "matmul", "--backend", "tvm", "--shape", "M=7,N=8,K=8",
                         "--server", server.url)  # fmt: skip
    assert bucketed.returncode == 0 and bucketed.stdout.startswith("matmul[K=8,M=8,N=8]")
    assert "matched    bucket rule for matmul[K=8,M=7,N=8] float32 tvm" in bucketed.stdout
    missed = tunecache("get", "matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=9", "--json",
                       "--server", server.url)  # fmt: skip
    assert missed.returncode == 1 and json.loads(missed.stdout)["hit"] is False


def test_tuning_triton_without_a_gpu_says_why_and_stores_nothing(shared_server: LiveServer) -> None:
    import os

    # Without the interpreter a Triton key names a GPU, and there is none; with it, its timings
    # mean nothing. Either way: exit 2, one line, nothing stored.
    expected = {"0": ("no CUDA device is visible", "run this on a GPU machine",
                      "or use --backend tvm or inductor on this CPU"),
                "1": ("interpreter", "timings")}  # fmt: skip
    for interpret, words in expected.items():
        env = {**os.environ, "TRITON_INTERPRET": interpret}
        done = subprocess.run(
            [sys.executable, "-m", "tunecache_cli", "tune", "matmul", "--backend", "triton",
             "--dtype", "float16", "--shape", "M=64,N=64,K=64", "--server", shared_server.url],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
        assert all(word in done.stderr for word in words), done.stderr
    assert httpx.get(f"{shared_server.url}/health").json()["records"] == 0


def test_replay_runs_strategies_on_a_landscape(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.test_landscape import bowl_landscape

    path = tmp_path / "bowl.json"
    bowl_landscape(seed=1).save(path)
    done = tunecache("replay", str(path), "--trials", "20")
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines()[3:]}
    assert set(rows) == {"exhaustive", "random", "optuna", "bayes", "portfolio"}
    assert all(int(r[1]) <= 20 for r in rows.values())
    as_json = json.loads(tunecache("replay", str(path), "--trials", "20", "--json").stdout)
    assert [r["strategy"] for r in as_json["results"]] == [
        "exhaustive",
        "random",
        "optuna",
        "bayes",
        "portfolio",
    ]
    assert all(0 < r["optimum_over_best"] <= 1 for r in as_json["results"])


def test_a_closed_pipe_is_not_an_error_message() -> None:
    # The reader leaves before the command writes (as `tunecache … | head` does mid-output).
    process = subprocess.Popen([sys.executable, "-m", "tunecache_cli", "workloads", "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141  # as a shell reports SIGPIPE; 1 is a miss's
    assert err == "", err


@pytest.mark.slow
def test_folders_named_like_ours_in_the_current_directory_shadow_nothing(tmp_path: Path) -> None:
    """A project with ``tunecache/``, ``workloads/``, ``backends/`` and ``tuner/`` folders (a clone
    named ``tunecache`` is one): the command and its measurement workers still import ours."""
    for folder in ("tunecache", "workloads", "backends"):
        (tmp_path / folder).mkdir()  # a namespace package, were it imported
    (tmp_path / "tuner").mkdir()
    (tmp_path / "tuner" / "__init__.py").write_text("raise ImportError('the user folder')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as installed, no more
    command = str(Path(sys.executable).with_name("tunecache"))
    listed = subprocess.run([command, "workloads", "--json"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    tuned = subprocess.run([command, "tune", "softmax", "--backend", "tvm", "--shape", "M=64,N=64",
                            "--trials", "2", "--no-upload", "--json"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    record = json.loads(tuned.stdout)  # --no-upload --json: the record, validated, on stdout
    assert record["key"]["kernel"] == "softmax" and record["validation"]["passed"] is True


def test_a_request_the_server_refuses_as_malformed_is_exit_2(shared_server: LiveServer) -> None:
    # An option the CLI passes on unchecked (an artifact key's length is the server's): its 422
    # is bad input, exit 2, one line; a missing record stays a miss, exit 1.
    done = tunecache("artifacts", "ls", "--partition", "p", "--key", "k" * 300,
                     "--server", shared_server.url)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "query.key" in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    # records ls checks its names itself (the server's pattern was what it said)
    arch = tunecache("records", "ls", "--device-arch", "x y", "--server", shared_server.url)
    assert arch.returncode == 2 and "--device-arch 'x y': a name starts with" in arch.stderr
    typo = tunecache("records", "ls", "--kernel", "matmull", "--device-arch", "cpu-avx51",
                     "--server", shared_server.url)  # fmt: skip
    assert typo.returncode == 1, typo.stderr
    assert "no records match (--kernel: did you mean 'matmul'?; --device-arch: did you mean " \
        "'cpu-avx512'?)" in typo.stdout  # fmt: skip
    own = tunecache("records", "ls", "--kernel", "my.ops:matmul", "--device-arch", "sm_130",
                    "--server", shared_server.url)  # fmt: skip
    assert own.returncode == 1 and own.stdout.strip() == "no records match", own.stdout
    missing = tunecache("records", "show", "999", "--server", shared_server.url)
    assert missing.returncode == 1 and "no record 999" in missing.stderr, missing.stderr


def test_server_errors_map_to_the_documented_exit_codes() -> None:
    from tunecache.errors import ServerError
    from tunecache_cli import server_exit
    from tunecache_cli.outbox import UploadRefused

    cases = [
        (ServerError("down"), 3),
        (ServerError("html", status_code=404, foreign=True), 2),  # not a tunecache server
        (ServerError("html", status_code=401, foreign=True), 2),
        (ServerError("bad query", status_code=422), 2),  # built from the user's arguments
        (ServerError("bad body", status_code=400), 2),
        (ServerError("too big", status_code=413), 2),
        (ServerError("token", status_code=401), 4),
        (ServerError("scope", status_code=403), 4),
        (ServerError("no record 9", status_code=404), 1),
        (ServerError("over its rate limit", status_code=429), 3),  # try again, as 503
        (ServerError("bug", status_code=500), 1),
        (UploadRefused("a tuned record refused", status_code=422), 1),  # not the user's input
    ]
    assert [(str(e), server_exit(e)) for e, _ in cases] == [(str(e), c) for e, c in cases]


def test_a_web_server_that_is_not_tunecache_is_exit_2_for_get_as_for_tune(tmp_path: Path) -> None:
    import time

    from cache_server.embedded import free_port

    port = free_port()
    (tmp_path / "v1").mkdir()  # a page at the path an export asks: a 200 that is not JSON
    (tmp_path / "v1" / "snapshot").write_text("<html><body>a web page</body></html>")
    web = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                            "127.0.0.1"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        key = ["matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=8", "--server", url]
        env = {**os.environ, "TUNECACHE_TOKEN": "tc_" + "3" * 43}
        out = ["-o", str(tmp_path / "s.json"), "--server", url]
        for argv in (["get", *key], ["tune", *key], ["records", "ls", "--server", url],
                     ["sync", "--arch", "sm_90", *out],  # exit 3, "gave no JSON", before
                     ["snapshot", "export", "--arch", "sm_90", *out]):  # fmt: skip
            done = subprocess.run([sys.executable, "-m", "tunecache_cli", *argv], env=env,
                                  capture_output=True, text=True, timeout=120)  # fmt: skip
            assert done.returncode == 2, (argv, done.stderr)
            assert "not a tunecache server" in done.stderr and "Traceback" not in done.stderr
            assert len(done.stderr.splitlines()) == 1, done.stderr
        assert not (tmp_path / "s.json").exists()
    finally:
        web.terminate()
        web.wait(timeout=30)


@pytest.mark.parametrize("command", ["get", "best"])
def test_a_triton_drop_in_kernel_is_named_as_written_with_what_to_do(command: str) -> None:
    pytest.importorskip("triton")
    ref = "tests.user_triton_autotune:affine"
    backend = ["--backend", "triton"] if command == "get" else []
    done = tunecache(command, ref, *backend, "--shape", "n=100", "--server", "http://127.0.0.1:9")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"tunecache: error: {ref} is a kernel of tunecache's Triton drop-in "
        "(tunecache.triton.autotune): the CLI does not look Triton kernels up by their Python "
        "object (the drop-in keys each launch by its arguments, dtypes included, and looks it up "
        "and tunes it as it launches); list its records with `tunecache records ls --kernel "
        f"{ref} --all`"
    )


def test_tune_tvm_says_what_each_uploaded_count_is() -> None:
    from tunecache.artifacts import ArtifactIn, ArtifactPutResult
    from tunecache_cli.tune_tvm import upload_summary

    def artifact(namespace: str, i: int) -> ArtifactIn:
        # only the namespace counts here: built unchecked (a value that may be served is long)
        return ArtifactIn.model_construct(namespace=namespace, partition="llvm-x", key="k",
                                          item=str(i), value={"i": i})  # fmt: skip

    items = [artifact("tvm.workload", 0)] + [artifact("tvm.record", i) for i in range(1, 6)]
    line = upload_summary(5, items, ArtifactPutResult(stored=4, kept=2), "http://h", "llvm-x")
    assert line == (
        "uploaded 5 validated records to http://h (partition llvm-x) as 6 artifacts (5 tuning "
        "records and the module's workload): the server stored 4 (new, or better than what it "
        "held) and kept what it held for 2"
    )
    unserved = upload_summary(5, items, ArtifactPutResult(stored=4, kept=2, served=False),
                              "http://h", "llvm-x")  # fmt: skip
    assert (
        unserved == line + "; this server serves only trusted tokens' artifacts (its "
        "verified policy; no verifier checks artifacts): this token's copies are served to no one"
    )


def test_a_path_in_the_url_that_no_route_has_is_refused_before_the_tune(
    shared_server: LiveServer,
) -> None:
    """``--server http://host:port/tc`` on a tunecache server: every answer a 404 with its
    identity, so the check before the tune took it for an older server, the whole tune ran, and
    its record was filed as refused."""
    started = time.monotonic()
    done = tunecache("tune", "softmax", "--backend", "tvm", "--shape", "M=16,N=32", "--trials", "2",
                     "--server", f"{shared_server.url}/tc")  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "is the path in the URL right?" in done.stderr and len(done.stderr.splitlines()) == 1
    assert time.monotonic() - started < 30  # refused before tuning


def test_get_says_how_the_time_was_measured_not_a_count_of_calls() -> None:
    """``median of 7800`` was 200 samples of 39 calls each, and a Triton interpreter's time read
    as a GPU's: the timer says both."""
    from datetime import UTC, datetime

    from tests.factories import make_record
    from tunecache.schemas import RecordPublic
    from tunecache_cli.get import describe

    record = make_record()
    for timer in ("perf_counter median of 200 samples x 39 calls",
                  "host clock, Triton's interpreter (not a GPU's time)"):  # fmt: skip
        timed = record.timing.model_copy(update={"timer": timer, "repeats": 7800})
        public = RecordPublic(**{**record.model_dump(), "timing": timed, "id": 1,
                                 "key_hash": record.key.digest(),
                                 "created_at": datetime(2026, 1, 1, tzinfo=UTC)})  # fmt: skip
        shown = describe(public)
        assert f"ms ({timer})" in shown and "7800" not in shown, shown


@pytest.mark.parametrize(("speedup", "shared"), [
    (Ratio(0.80, 0.74, 0.86, 5), False),  # measurably slower: not uploaded, saying why
    (Ratio(0.99, 0.95, 1.03, 5), True),  # the same within noise
    (Ratio(1.40, 1.30, 1.52, 5), True),
])  # fmt: skip
def test_tune_tvm_shares_no_schedule_slower_than_tvms_default(speedup: Ratio, shared: bool) -> None:
    from tunecache_cli.tune_tvm import slower_than_default

    why = slower_than_default(Compared(baseline_ms=1.0, tuned_ms=1.0 / speedup.median,
                                       speedup=speedup))  # fmt: skip
    assert (why is None) == shared
    if not shared:
        assert why == ("the best schedule ran 1.25x slower than TVM's default schedule "
                       "(1.16-1.35x) here: a process served it would run slower")  # fmt: skip


def test_a_tune_not_uploaded_prints_its_record_in_lines_and_as_json_only_when_asked(
    tmp_path: Path,
) -> None:
    """``tune --no-upload`` printed the whole record as JSON, several hundred lines, where an
    uploaded one prints a few; now both print the few (what is not stored says so) and
    ``--json`` the record, as every command that prints data."""
    from tests.factories import make_record
    from tunecache_cli.get import describe

    said = describe(make_record(time_ms=2.0))
    assert said.splitlines()[0].startswith("matmul[") and "2 ms" in said
    assert "stored     no (validated here)" in said and "record     #" not in said
    done = tunecache("tune", "--torch", f"{tmp_path / 'model.py'}:f", "--json")
    assert done.returncode == 2 and "--json (it prints a kernel key's record)" in done.stderr


def test_a_server_that_never_answers_is_waited_for_out_loud(tmp_path: Path) -> None:
    """A server that took the connection and never answered kept ``records ls``, ``records
    show``, ``best``, ``token list``, ``sync``, ``coverage``, ``snapshot export`` and ``report``
    silent for their whole timeout (60 s): they now say, every few seconds, that they are asking
    it."""
    import socket

    from tunecache_cli.progress import HEARTBEAT_SECONDS

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections are taken (by the kernel), never answered
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        (tmp_path / "m.toml").write_text('[[tune]]\nkernel = "softmax"\nbackends = ["tvm"]\n'
                                         'shapes = [{M = 8, N = 8}]\n')  # fmt: skip
        for argv in (["records", "ls"], ["records", "show", "1"],
                     ["best", "matmul", "--shape", "M=64,N=64,K=64"], ["token", "list"],
                     ["sync", "-o", "s.json", "--timeout", "60"], ["coverage", "m.toml"],
                     ["snapshot", "export", "--arch", "x", "-o", "e.json"], ["report", "-o", "out"]):  # fmt: skip
            process = subprocess.Popen([sys.executable, "-m", "tunecache_cli", *argv, "--server",
                                        url], stderr=subprocess.PIPE, text=True, cwd=tmp_path)  # fmt: skip
            said = f"asking the server at {url}, waiting for its answer up to "
            assert process.stderr is not None
            started = time.monotonic()
            heard = next((line for line in process.stderr if said in line), None)  # or its end
            waited = time.monotonic() - started
            process.kill()
            process.communicate(timeout=30)
            assert heard is not None and waited >= HEARTBEAT_SECONDS, (argv, heard)
            bound = "10 s" if argv[0] == "best" else "60 s"  # best asks /health first, briefly
            assert f"up to {bound} a call (still working)" in heard, heard


def test_asking_a_server_that_answers_at_once_leaves_no_line_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a terminal the wait was a rich bar, left in the scrollback by every ``records ls``,
    however fast the answer: it says something only once the wait has lasted."""
    import io

    from tunecache_cli.progress import asking

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with asking("records ls", "http://cache.test:8765"):
        pass
    assert terminal.getvalue() == ""


def test_https_to_a_plain_http_server_says_so(shared_server: LiveServer) -> None:
    """It said only "[SSL: WRONG_VERSION_NUMBER] wrong version number"."""
    url = shared_server.url.replace("http://", "https://")
    done = tunecache("get", "matmul", "--backend", "tvm", "--shape", "M=8,N=8,K=8",
                     "--server", url)  # fmt: skip
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert "the server there speaks plain HTTP: use an http:// URL" in done.stderr, done.stderr


def test_key_for_a_triton_drop_in_kernel_says_what_it_is() -> None:
    """``tunecache.key_for`` on a drop-in kernel said to tune it with ``--tvm`` or ``--torch``."""
    pytest.importorskip("triton")
    import subprocess as sp

    code = ("import tunecache\ntry:\n    tunecache.key_for('tests.user_triton_autotune:affine', "
            "'triton', {'n': 100}, 'float32')\nexcept tunecache.InvalidInput as exc:\n"
            "    print(exc)\n")  # fmt: skip
    done = sp.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                  env={**os.environ, "TRITON_INTERPRET": "1"})  # fmt: skip
    assert (
        "'tests.user_triton_autotune:affine' is a kernel of tunecache's Triton drop-in"
        in done.stdout
    ), done.stderr
    assert "--tvm" not in done.stdout and "records ls --kernel" in done.stdout


def test_a_port_that_closes_without_an_http_answer_is_hinted(tmp_path: Path) -> None:
    """PostgreSQL's port given for the server's: 'Server disconnected without sending a
    response', and no word of what it may be."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))

    def close_each() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(1024)
                conn.shutdown(socket.SHUT_RDWR)  # as a database does, reading no startup packet

    threading.Thread(target=close_each, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        done = tunecache("records", "ls", "--server", url)
    finally:
        listener.close()
    assert done.returncode == 3, done.stderr
    assert "(is it an HTTP server: a database's port, say, not `tunecache serve`'s?)" in (
        done.stderr
    ), done.stderr


def test_a_foreign_answer_names_its_host_without_a_port_it_did_not_name() -> None:
    """``https://example.com``'s web page was named ``example.com:None`` (a review)."""
    from tunecache.http import foreign, rejected

    page = httpx.Response(200, request=httpx.Request("GET", "https://example.com/v1/snapshot"))
    assert str(foreign(page, "/v1/snapshot")).startswith("/v1/snapshot: example.com answered")
    other = httpx.Response(404, request=httpx.Request("GET", "http://u:pw@10.0.0.1:8000/v1/x"))
    said = str(rejected("GET", "/v1/x", other))
    assert "from 10.0.0.1:8000, which is not" in said and "pw" not in said
