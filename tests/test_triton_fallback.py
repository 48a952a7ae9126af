"""The Triton drop-in where something is wrong: a tuned pick that fails validation, a config that
cannot run under the interpreter, a malformed ``TUNECACHE_URL``, a token the server refuses.

Each kernel runs in a fresh process under ``TRITON_INTERPRET=1``: Triton 3.9's interpreter
patches ``triton.language`` for good in the process that runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cache_server.embedded import free_port
from tests.conftest import LiveServer
from tests.factories import issue_token

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent

# BLOCK=128 is listed first and timed fastest, and adds 1: wrong. 64 is timed next, 32 last.
KERNEL = """
import os, torch, triton, triton.language as tl
import tunecache.triton

TIMES = ({64: 0.01, 32: 0.02, 128: 0.03} if os.environ.get("TEST_64_FASTEST")
         else {128: 0.01, 64: 0.02, 32: 0.03})
BENCHED = []

def bench(kernel_call, quantiles=None):
    BENCHED.append(1)
    kernel_call()
    return [TIMES[CURRENT[0]]] * 3

CURRENT = [0]

def hook(nargs):
    CURRENT[0] = nargs["BLOCK"]

def reference(x, y, n):
    y.copy_(x * 2.0 + (5.0 if os.environ.get("TEST_WRONG_REFERENCE") else 0.0))

UNSUPPORTED = int(os.environ.get("TEST_UNSUPPORTED", "0"))
UNSUPPORTED_BELOW = int(os.environ.get("TEST_UNSUPPORTED_BELOW", "0"))
CONFIGS = [triton.Config({"BLOCK": b}, num_warps=1, pre_hook=hook) for b in (128, 32, 64)]

@tunecache.triton.autotune(configs=CONFIGS, key=["n"], do_bench=bench,
                           reference=None if os.environ.get("TEST_NO_REFERENCE") else reference)
@triton.jit
def double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    tl.static_assert(BLOCK != UNSUPPORTED, "BLOCK unsupported")
    tl.static_assert(BLOCK > UNSUPPORTED_BELOW, "all unsupported")
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    bump = 1.0 if BLOCK == 128 else 0.0
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2.0 + bump, mask=m)
"""

RUN = """
import json, torch
import userkernel as m
x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
y = torch.empty_like(x)
m.double[lambda meta: (triton.cdiv(1000, meta["BLOCK"]),)](x, y, 1000)
print(json.dumps({"right": bool(torch.allclose(y, x * 2.0)), "launched": m.double.best_config.kwargs,
                  "sources": [type(s).__name__ for s in m.double._client().resolver.sources],
                  "benched": len(m.BENCHED)}))
""".replace("import json, torch", "import json, torch, triton")


NO_SERVER = "htp://x"  # malformed: no server asked


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "userkernel.py").write_text(KERNEL)
    # No server at all (a malformed URL): a miss is tuned here; a server that does not answer
    # is not a miss (nothing is tuned then).
    full = {**os.environ, "TRITON_INTERPRET": "1", "TUNECACHE_URL": NO_SERVER,
            "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), **env}  # fmt: skip
    return subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=full)  # fmt: skip


def result(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return answer


def test_a_wrong_pick_falls_back_to_the_fastest_config_that_passes(tmp_path: Path) -> None:
    """The first listed config is the wrong pick itself: launching it (the old fallback) gave
    the caller a wrong result while the warning said it was replaced."""
    found = result(run(tmp_path))
    assert found["right"] is True and found["launched"] == {"BLOCK": 64}, found
    stderr = run(tmp_path).stderr
    assert stderr.count("failed validation") == 1, stderr
    assert "this call and the later ones launch BLOCK: 64" in stderr
    assert "the fastest config that passed (checked 1)" in stderr


def test_the_config_launched_for_a_wrong_pick_is_shared_and_served(
    server: LiveServer, tmp_path: Path
) -> None:
    """The fastest config that passed in the wrong pick's place was launched and never
    uploaded: every new process benchmarked the kernel again, for good. Now it is the key's
    record, the wrong pick's trial saying so, and a fresh process launches it unbenchmarked."""
    env = {"TUNECACHE_URL": server.url, "TUNECACHE_TOKEN": issue_token(server.url, "write")}
    tuned = run(tmp_path, **env)
    assert result(tuned)["launched"] == {"BLOCK": 64} and result(tuned)["benched"] == 3
    assert "the fastest config that passed (checked 1): the key's record in its place" in (
        tuned.stderr
    )
    (record,) = httpx.get(f"{server.url}/v1/records", timeout=30).json()["items"]
    assert record["config"]["BLOCK"] == 64 and record["validation"]["passed"] is True
    full = httpx.get(f"{server.url}/v1/records/{record['id']}", timeout=30).json()
    trials = {t["config"]["BLOCK"]: (t["status"], t["time_ms"]) for t in full["trials"]}
    assert trials[128] == ("wrong_answer", None), trials
    assert trials[64][0] == trials[32][0] == "ok" and trials[64][1] < trials[32][1], trials
    (said,) = [t["error"] for t in full["trials"] if t["config"]["BLOCK"] == 128]
    assert said.startswith("failed the check: "), said
    # the wrong pick is the kernel's first config: no baseline ("2.00x slower than the default")
    assert [b["name"] for b in full["baselines"]] == [], full["baselines"]
    served = result(run(tmp_path, **env))
    assert served == {**served, "right": True, "launched": {"BLOCK": 64}, "benched": 0}, served


def test_without_a_reference_the_config_launched_for_a_wrong_pick_is_not_shared(
    server: LiveServer, tmp_path: Path
) -> None:
    """Checked against the kernel's first config (no reference=), a disagreement proves neither
    wrong: here the first config is the wrong one, the right pick "failed", and the config
    that agreed with the first, the wrong one, was about to be served as the key's record."""
    env = {"TUNECACHE_URL": server.url, "TUNECACHE_TOKEN": issue_token(server.url, "write"),
           "TEST_NO_REFERENCE": "1", "TEST_64_FASTEST": "1"}  # fmt: skip
    done = run(tmp_path, **env)
    assert result(done)["launched"] == {"BLOCK": 128}  # as before: what agrees with the first
    assert "not uploaded (checked against the kernel's first config, with no reference=" in (
        done.stderr
    )
    assert httpx.get(f"{server.url}/v1/records", timeout=30).json()["items"] == []


def test_no_config_passing_blames_the_reference_and_launches_tritons_pick(
    tmp_path: Path,
) -> None:
    """Every config disagrees with a wrong reference: one warning says so, and Triton's own pick
    runs (as where the reference cannot run), never one chosen for being listed first."""
    done = run(tmp_path, TEST_WRONG_REFERENCE="1")
    found = result(done)
    assert found["launched"] == {"BLOCK": 128}, found
    assert done.stderr.count("failed validation") == 1, done.stderr
    assert "and so did the 2 other config(s) the kernel keeps: the reference may be wrong" in (
        done.stderr
    )
    assert "launch BLOCK: 128" in done.stderr and "Triton's pick, unchecked" in done.stderr


def test_a_config_whose_static_assert_fails_is_skipped_under_the_interpreter(
    tmp_path: Path,
) -> None:
    """As a GPU compile counts it ("cannot run"); one failing for every config is the user's."""
    done = run(tmp_path, TEST_UNSUPPORTED="64")
    found = result(done)
    assert found["right"] is True and found["launched"] == {"BLOCK": 32}, found
    assert "BLOCK: 64" in done.stderr and "cannot run" in done.stderr
    assert "Traceback" not in done.stderr
    every = run(tmp_path, TEST_UNSUPPORTED_BELOW="1000")
    assert every.returncode != 0 and "all unsupported" in every.stderr, every.stderr
    assert "validation" not in every.stderr, every.stderr  # no config ran: nothing to check


def test_a_malformed_url_asks_no_server_at_all(tmp_path: Path) -> None:
    """Not the default server (someone else's on a shared host): one warning naming it."""
    done = run(tmp_path, TUNECACHE_URL="htp://x", TUNECACHE_TOKEN="tc_" + "3" * 43)
    found = result(done)
    assert "ServerSource" not in found["sources"], found
    assert done.stderr.count("TUNECACHE_URL='htp://x'") == 1, done.stderr
    assert "no cache server is asked" in done.stderr
    assert "127.0.0.1" not in done.stderr and "upload of" not in done.stderr, done.stderr


def test_a_refused_token_is_named_where_the_upload_waits(server: LiveServer) -> None:
    """The warnings said only that the upload waits in the outbox, then that the server "failed
    less than 30 s ago": never that it refused the token. The lookup's refusal said "using
    default configs", and the kernel was tuned (a refusal is an answer: a miss)."""
    script = (
        "import torch, tests.user_triton_autotune as m\n"
        "for n in (1000, 3000):  # two keys, two uploads: one warning\n"
        "    x = torch.randn(n)\n"
        "    assert torch.allclose(m.launch(x), x * 2 + 1)\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1", "TUNECACHE_URL": server.url,
           "TUNECACHE_TOKEN": "tc_nope"}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "refused the token" in line]
    assert len(said) == 1, done.stderr
    assert "401" in said[0] and "not known to this server" in said[0] and "waits in" in said[0]
    assert "failed less than" not in done.stderr, done.stderr
    # The lookup's refusal is a miss, tuned here: it said "using default configs", then tuned.
    assert "using default configs" not in done.stderr, done.stderr
    looked = [line for line in done.stderr.splitlines() if "each lookup a miss" in line]
    assert len(looked) == 1 and "401" in looked[0], done.stderr
    # both name the token refused and the server (they named neither)
    named = f"(the token in $TUNECACHE_TOKEN, sent to {server.url})"
    assert named in said[0] and named in looked[0], done.stderr


def test_a_config_whose_check_cannot_run_is_launched_before_the_failed_pick() -> None:
    """A check that could not run here (no memory for the copies) is no disagreement: when no
    config passed, the failed pick ran into the caller's tensors, the reference blamed."""
    from triton import Config

    from tunecache.triton.fallback import fall_back

    failed, slow, unknown = (Config({"BLOCK": b}) for b in (128, 64, 32))
    times = {failed: [1.0], slow: [3.0], unknown: [2.0]}
    verdicts = {slow: False, unknown: None}  # None: the check could not run
    found = fall_back(failed, times, [failed, slow, unknown], verdicts.__getitem__)
    assert (found.config, found.launched, found.checked) == (None, unknown, 2)
    assert found.wrong == (slow,)  # the one whose check ran and failed; not the unknown one
    assert "could not run here" in found.warning("pick failed", "later calls")
    every = fall_back(failed, times, [failed, slow, unknown], lambda config: False)
    assert every.launched is failed and "the reference may be wrong" in every.warning("x", "y")


def test_a_faster_config_whose_check_could_not_run_is_no_plain_ok_trial() -> None:
    """The record of a replaced pick: a config timed faster than the one that passed, whose
    check could not run here, was an ``ok`` trial faster than the winner, nothing saying it
    went unvalidated. It keeps its time (not known wrong) and says why it is not the winner."""
    from triton import Config

    from tests.factories import make_key, make_record
    from tunecache.triton.fallback import UNSURE, fall_back, reasons
    from tunecache.triton.record import build_record

    tile = {"BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}
    failed, unknown, wrong, right = (Config({"BLOCK_M": b, **tile}) for b in (128, 64, 32, 16))
    times = {failed: 1.0, unknown: 2.0, wrong: 3.0, right: 4.0}  # do_bench answers
    verdicts = {unknown: None, wrong: False, right: True}
    found = fall_back(failed, times, list(times), verdicts.__getitem__)
    assert (found.config, found.unsure, found.wrong, found.unchecked) == (
        right,
        (unknown,),
        (wrong,),
        unknown,
    )
    key = make_key(kernel="matmul", backend="triton", dtype="float16")
    report = make_record().validation
    record = build_record(key, right, times, failed, report, 1.0, marks=reasons(found, {}))
    assert record is not None and record.config["BLOCK_M"] == 16
    said = {t.config["BLOCK_M"]: (t.status, t.time_ms, t.error) for t in record.trials}
    assert said[64] == ("ok", 2.0, UNSURE), said
    assert said[16] == ("ok", 4.0, "") and said[32][0] == said[128][0] == "wrong_answer", said
    assert [b.name for b in record.baselines] == []  # the default (the failed pick) is wrong
