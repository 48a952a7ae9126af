"""The drop-in's first launch at a key and its checks, held to Triton's own launch.

Triton's ``run`` resets ``reset_to_zero`` outputs before the first launch at a key it
benchmarked: a served, default or another rank's config must get that reset too, and so must
each launch a check makes on its copies (a split-K kernel adds into its output). A check that
cannot judge (the reference's own output NaN) disputes nothing; ``outputs=`` says what a check
compares (a scratch buffer of partials laid out by ``BLOCK`` is not an output); a mismatch
against the first config (no ``reference=``) is not proof enough to dispute a record for
everyone. A server that does not answer is not a miss: nothing is tuned (issue: outside audit).

Each run is a fresh process under ``TRITON_INTERPRET=1``: Triton 3.9's interpreter patches
``triton.language`` for good in the process that runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from cache_server.embedded import free_port
from tests.conftest import LiveServer
from tests.factories import TEST_TOKEN

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent

KERNELS = """
import json, os, torch, triton, triton.language as tl
import tunecache.triton

VERIFY = os.environ.get("TEST_VERIFY", "never")
OUTPUTS = json.loads(os.environ.get("TEST_OUTPUTS", "null"))
CALLS = []

def bench(kernel_call, quantiles=None):  # each config timed faster than the one before
    kernel_call()
    CALLS.append(1)
    return [10.0 - len(CALLS)] * len(quantiles) if quantiles else 10.0 - len(CALLS)

SPLIT = [triton.Config({"BLOCK": 32, "SPLIT_K": s}, num_warps=4) for s in (1, 4)]

@tunecache.triton.autotune(SPLIT, key=["K"], reset_to_zero=["out_ptr"], verify=VERIFY,
                           do_bench=bench)
@triton.jit
def split_sum(x_ptr, out_ptr, K, BLOCK: tl.constexpr, SPLIT_K: tl.constexpr):
    pid = tl.program_id(0)
    chunk = tl.cdiv(K, SPLIT_K)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, chunk, BLOCK):
        offs = pid * chunk + start + tl.arange(0, BLOCK)
        m = (offs < K) & (offs < (pid + 1) * chunk)
        acc += tl.load(x_ptr + offs, mask=m, other=0.0)
    s = tl.sum(acc, axis=0)
    if SPLIT_K == 1:
        tl.store(out_ptr, s)
    else:
        tl.atomic_add(out_ptr, s)

BLOCKS = [triton.Config({"BLOCK": b}, num_warps=4) for b in (32, 64, 128)]

@tunecache.triton.autotune(BLOCKS, key=["n"], verify=VERIFY, do_bench=bench)
@triton.jit
def adam_like(x_ptr, v_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    v = tl.load(v_ptr + offs, mask=m)
    tl.store(y_ptr + offs, x / (tl.sqrt(v) + 1e-8), mask=m)

@tunecache.triton.autotune(BLOCKS, key=["n"], do_bench=bench)
@triton.jit
def double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)

@tunecache.triton.autotune(BLOCKS, key=["n"], do_bench=bench)
@triton.jit
def triple(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 3.0, mask=offs < n)

PARTIAL_OPTIONS = {} if OUTPUTS is None else {"outputs": OUTPUTS}

@tunecache.triton.autotune(BLOCKS, key=["n"], verify=VERIFY, do_bench=bench,
                           reset_to_zero=["total_ptr"], **PARTIAL_OPTIONS)
@triton.jit
def partial_sums(x_ptr, part_ptr, total_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    s = tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0)
    tl.store(part_ptr + pid, s)  # scratch: one partial per block, laid out by BLOCK
    tl.atomic_add(total_ptr, s)
"""

RUN = """
import json, os, sys, torch, triton
import hookkernels as m
from tunecache.triton.keys import KernelIdentity, key_of_call

cases, serve = json.loads(sys.argv[1]), json.loads(sys.argv[2])
found = []
for case in cases:
    g = torch.Generator().manual_seed(len(found))
    if case == "split":
        n, kernel = 1000, m.split_sum
        x = torch.randn(n, generator=g)
        args, grid = (x, torch.full((1,), 123.0), n), lambda meta: (meta["SPLIT_K"],)
        right = lambda: abs(args[1].item() - x.sum().item()) < 1e-3
    elif case == "adam":
        n, kernel = 1000, m.adam_like
        x, v = torch.randn(n, generator=g), torch.rand(n, generator=g) + 0.1
        args = (x, v, torch.empty(n), n)
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
        right = lambda: bool(torch.allclose(args[2], x / (v.sqrt() + 1e-8)))
    elif case in ("double", "triple"):
        n, kernel, factor = 1000, getattr(m, case), 2.0 if case == "double" else 3.0
        x = torch.randn(n, generator=g)
        args, grid = (x, torch.empty(n), n), lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
        right = lambda: bool(torch.allclose(args[1], x * factor))
    else:
        n, kernel = 1000, m.partial_sums
        x = torch.randn(n, generator=g)
        args = (x, torch.empty(triton.cdiv(n, 32)), torch.full((1,), 5.0), n)
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
        right = lambda: abs(args[2].item() - x.sum().item()) < 1e-3
    record = None
    if serve.get(case) is not None:
        from tests.factories import make_record
        from tunecache.client import Client
        named = dict(zip(kernel.arg_names, args))
        key = key_of_call(KernelIdentity.of(kernel.fn), kernel.keys, named)
        config = {**serve[case], "num_warps": 4, "num_stages": 3}
        with Client(os.environ["TUNECACHE_URL"], token=os.environ["TEST_ADMIN_TOKEN"]) as c:
            record = c.upload(make_record(key, time_ms=0.001, config=config)).record_id
    before = len(m.CALLS)
    kernel[grid](*args)
    found.append({"case": case, "right": right(), "best": kernel.best_config.kwargs,
                  "benched": len(m.CALLS) - before, "record": record})
print(json.dumps(found))
"""


def run(tmp_path: Path, cases: list[str], serve: dict[str, Any] | None = None,
        **env: str) -> tuple[list[dict[str, Any]], str]:  # fmt: skip
    """``cases`` launched once each in a fresh process; what each found, and its stderr."""
    (tmp_path / "hookkernels.py").write_text(KERNELS)
    full = {**os.environ, "TRITON_INTERPRET": "1", "TEST_ADMIN_TOKEN": TEST_TOKEN,
            "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), **env}  # fmt: skip
    full = {k: v for k, v in full.items() if v != "<unset>"}
    done = subprocess.run([sys.executable, "-c", RUN, json.dumps(cases), json.dumps(serve or {})],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=full)  # fmt: skip
    assert done.returncode == 0, done.stderr
    found: list[dict[str, Any]] = json.loads(done.stdout.splitlines()[-1])
    return found, done.stderr


def disputed(url: str, record: int) -> bool:
    answer = httpx.get(f"{url}/v1/records/{record}",
                       headers={"Authorization": f"Bearer {TEST_TOKEN}"}).json()  # fmt: skip
    return any(bool(v) for k, v in answer.items() if "disput" in k)


def test_a_served_split_k_config_gets_tritons_reset_first(server: LiveServer,
                                                          tmp_path: Path) -> None:  # fmt: skip
    """The output starts at 123.0: plain Triton's first call gives the sum; the served
    SPLIT_K=4 config added into 123.0 (151.9 for 28.9)."""
    found, stderr = run(tmp_path, ["split"], {"split": {"BLOCK": 32, "SPLIT_K": 4}},
                        TUNECACHE_URL=server.url)  # fmt: skip
    assert found[0]["best"] == {"BLOCK": 32, "SPLIT_K": 4} and found[0]["benched"] == 0, found
    assert found[0]["right"], (found, stderr)


def test_a_tuned_split_k_winner_is_checked_with_the_reset(server: LiveServer,
                                                          tmp_path: Path) -> None:  # fmt: skip
    """Both check launches got the same random copy of ``out``: the first config overwrote it,
    the SPLIT_K=4 winner added to it and "failed validation"."""
    found, stderr = run(tmp_path, ["split"], TUNECACHE_URL=server.url)
    assert found[0]["best"] == {"BLOCK": 32, "SPLIT_K": 4} and found[0]["benched"] == 2, found
    assert found[0]["right"] and "failed validation" not in stderr, stderr


def test_verify_first_passes_a_right_split_k_record(server: LiveServer, tmp_path: Path) -> None:
    """It was disputed on the server: out of service for everyone."""
    found, stderr = run(tmp_path, ["split"], {"split": {"BLOCK": 32, "SPLIT_K": 4}},
                        TUNECACHE_URL=server.url, TEST_VERIFY="first")  # fmt: skip
    assert found[0]["best"] == {"BLOCK": 32, "SPLIT_K": 4} and found[0]["right"], found
    assert not disputed(server.url, found[0]["record"]), stderr


def test_verify_first_keeps_a_positive_input_positive(server: LiveServer, tmp_path: Path) -> None:
    """``x / (sqrt(v) + eps)`` with the caller's ``v > 0``: a normal draw of ``v`` gave NaN for
    both sides, and a right record was disputed."""
    found, stderr = run(tmp_path, ["adam"], {"adam": {"BLOCK": 64}}, TUNECACHE_URL=server.url,
                        TEST_VERIFY="first")  # fmt: skip
    assert found[0]["best"] == {"BLOCK": 64} and found[0]["right"], (found, stderr)
    assert not disputed(server.url, found[0]["record"]), stderr
    assert "NaN" not in stderr, stderr


def test_a_reference_whose_output_is_nan_cannot_check() -> None:
    """NaN on both sides is no evidence against the config: CheckUnavailable, not a failure."""
    from types import SimpleNamespace

    import torch
    from triton import Config

    from tunecache.errors import CheckUnavailable
    from tunecache.key import key_for
    from tunecache.triton.checking import run_check

    def reference(x: Any, y: Any) -> None:
        y.copy_(torch.log(-x.abs() - 1))  # NaN wherever the inputs are

    tuner = SimpleNamespace(arg_names=["x", "y"], reference=reference, outputs=None,
                            reset_to_zero=[], pre_hook=lambda nargs, reset_only=False: 0,
                            fn=SimpleNamespace(run=lambda x, y, **meta: y.copy_(x)))  # fmt: skip
    key = key_for("softmax", "triton", {"M": 8, "N": 8}, "float32")
    with pytest.raises(CheckUnavailable, match="reference's own output 'y' has NaN"):
        run_check(tuner, Config({"BLOCK": 8}), None, (torch.ones(8), torch.empty(8)), {},
                  1e-4, key)  # fmt: skip


def test_outputs_leaves_a_scratch_buffer_out_of_the_check(server: LiveServer,
                                                           tmp_path: Path) -> None:  # fmt: skip
    """Partials laid out by BLOCK differ between right configs: the tuned pick (the last,
    fastest config) was replaced by the slowest for failing against the first."""
    found, stderr = run(tmp_path, ["partials"], TUNECACHE_URL=server.url,
                        TEST_OUTPUTS='["total_ptr"]')  # fmt: skip
    assert found[0]["best"] == {"BLOCK": 128} and found[0]["right"], (found, stderr)
    assert "failed validation" not in stderr, stderr


def test_a_mismatch_with_the_first_config_disputes_nothing(server: LiveServer,
                                                           tmp_path: Path) -> None:  # fmt: skip
    """Without ``reference=`` (and without ``outputs=``, so the partials are compared) the
    served BLOCK=128 differs from the first config: not used here, one warning, not disputed."""
    found, stderr = run(tmp_path, ["partials"], {"partials": {"BLOCK": 128}},
                        TUNECACHE_URL=server.url, TEST_VERIFY="first")  # fmt: skip
    assert found[0]["right"], found
    assert not disputed(server.url, found[0]["record"]), stderr
    assert stderr.count("differ from the kernel's first config") == 1, stderr


@pytest.mark.parametrize("where", ["refused", "silent"])
def test_a_server_that_does_not_answer_tunes_nothing(tmp_path: Path, where: str) -> None:
    """Each kernel was benchmarked (minutes on a GPU) and warned "tuned here, not uploaded":
    the server down is one warning, and each kernel's first config, reset as Triton resets."""
    if where == "refused":
        url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        found, stderr = run(tmp_path, ["split", "adam", "partials"], TUNECACHE_URL=url)
    else:
        import socket

        with socket.socket() as silent:  # accepts, never answers
            silent.bind(("127.0.0.1", 0))
            silent.listen(16)
            url = f"http://127.0.0.1:{silent.getsockname()[1]}"
            found, stderr = run(tmp_path, ["split", "adam", "partials"], TUNECACHE_URL=url,
                                TUNECACHE_TIMEOUT="0.3")  # fmt: skip
    assert [f["benched"] for f in found] == [0, 0, 0], (found, stderr)
    assert [f["best"]["BLOCK"] for f in found] == [32, 32, 32] and all(f["right"] for f in found)
    assert stderr.count("using default configs") == 1, stderr  # the one warning
    assert "tuned here" not in stderr, stderr


def test_a_miss_still_tunes_and_says_no_token_once(server: LiveServer, tmp_path: Path) -> None:
    """A real miss tunes; the missing token is one warning for the process, not one a kernel."""
    found, stderr = run(tmp_path, ["double", "triple"], TUNECACHE_URL=server.url,
                        TUNECACHE_TOKEN="<unset>")  # fmt: skip
    assert [f["benched"] for f in found] == [3, 3], (found, stderr)
    assert stderr.count("tuned here, not uploaded") == 1, stderr
    assert "using default configs" not in stderr, stderr


def test_a_runtime_argument_set_by_the_configs_is_named_as_such(tmp_path: Path) -> None:
    """It said "meta-parameters ['BLOCK', 'ITERS'] are not the kernel's tuned ['BLOCK',
    'ITERS']": the same list twice. ITERS is a runtime argument, not a ``tl.constexpr``."""
    from tunecache.triton.keys import KernelIdentity, call_device, misfit

    source = (
        "import triton, triton.language as tl\n"
        "@triton.jit\n"
        "def copy2(x_ptr, y_ptr, n, ITERS, BLOCK: tl.constexpr):\n"
        "    pass\n"
    )
    namespace: dict[str, Any] = {}
    file = tmp_path / "copy2.py"
    file.write_text(source)  # Triton reads a kernel's source from its file
    exec(compile(source, str(file), "exec"), namespace)
    identity = KernelIdentity.of(namespace["copy2"])
    config = {"BLOCK": 64, "ITERS": 2, "num_warps": 4, "num_stages": 3}
    why = misfit(config, identity, {"BLOCK": int, "ITERS": int}, call_device([]))
    assert why is not None and "['ITERS'] is not tl.constexpr" in why, why
    assert "are not the kernel's tuned" not in why


OUTAGE = """
import json, os, time, torch, triton
import hookkernels as m
from tests.factories import make_record
from tunecache.client import Client
from tunecache.triton.keys import KernelIdentity, key_of_call

n, kernel = 1000, m.double
x = torch.randn(n)
args, grid = (x, torch.empty(n), n), lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
key = key_of_call(KernelIdentity.of(kernel.fn), kernel.keys, dict(zip(kernel.arg_names, args)))
with Client(os.environ["TUNECACHE_URL"], token=os.environ["TEST_ADMIN_TOKEN"]) as c:
    c.upload(make_record(key, time_ms=0.001, config={"BLOCK": 128, "num_warps": 4,
                                                      "num_stages": 3}))
server = kernel._client().server
server._down_until, server._down_unanswered = time.monotonic() + 600, True  # as after a timeout
found = []
for up in (False, False, True):
    if up:
        server._down_until = 0.0  # the server may be asked again, and retry_after has passed
        kernel._meanwhile._due.update(dict.fromkeys(kernel._meanwhile._due, 0.0))
    before = len(m.CALLS)
    kernel[grid](*args)
    found.append({"best": kernel.best_config.kwargs["BLOCK"], "benched": len(m.CALLS) - before,
                  "right": bool(torch.allclose(args[1], x * 2.0))})
print(json.dumps(found))
"""


def test_a_key_launched_while_the_server_did_not_answer_is_asked_again(
    server: LiveServer, tmp_path: Path
) -> None:
    """The first config launched during an outage (a slow first lookup, one shed 503) stayed
    the key's config for the whole process; it is now asked for again once the server may
    be, and the served config runs from then on."""
    (tmp_path / "hookkernels.py").write_text(KERNELS)
    env = {**os.environ, "TRITON_INTERPRET": "1", "TEST_ADMIN_TOKEN": TEST_TOKEN,
           "TUNECACHE_URL": server.url,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", OUTAGE], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert [f["best"] for f in found] == [32, 32, 128], (found, done.stderr)
    assert [f["benched"] for f in found] == [0, 0, 0] and all(f["right"] for f in found)


def test_outputs_must_name_something_to_compare() -> None:
    """``outputs=[]`` compared nothing: every check passed, and a record was uploaded as
    validated with no error."""
    import triton
    import triton.language as tl

    import tunecache.triton
    from tunecache.errors import InvalidInput

    def body(x_ptr, y_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        pass

    configs = [triton.Config({"BLOCK": b}) for b in (32, 64)]
    for outputs in ([], ["y_ptr", "y_ptr"]):
        with pytest.raises(InvalidInput, match="outputs="):
            tunecache.triton.autotune(configs, key=["n"], outputs=outputs)(triton.jit(body))
