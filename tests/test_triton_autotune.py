"""``tunecache.triton.autotune`` on a user's Triton kernel (Triton's interpreter on a CPU).

Process A misses, tunes as Triton does and uploads; process B, fresh, launches with zero
benchmark calls from the server; process C does the same from a snapshot file with the server
down; process D, server down and no snapshot, runs the first config after one warning.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cache_server.embedded import free_port
from tests.conftest import LiveServer
from tunecache.client import Client
from tunecache.device import local_device
from tunecache.snapshot import save_snapshot

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SCRIPT = """
import json, logging, os, torch
if os.environ.get("TEST_LOG_INFO"):  # the drop-in's one line per new key, hit or miss
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
import tests.user_triton_autotune as m
x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
y = m.launch(x)
assert torch.allclose(y, x * 2 + 1), "wrong result"
from tunecache.triton.record import config_json
print(json.dumps({"bench": len(m.BENCH_CALLS), "config": config_json(m.affine.best_config)}))
"""


def run(env: dict[str, str]) -> tuple[dict[str, Any], str]:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env={**os.environ, "TRITON_INTERPRET": "1", **env})  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def test_tuned_once_then_launched_with_zero_benchmarking_everywhere(
    server: LiveServer, tmp_path: Path
) -> None:
    said = {"TEST_LOG_INFO": "1"}
    tuned, log = run({"TUNECACHE_URL": server.url, **said})
    assert tuned["bench"] == 6  # a miss: every listed config benchmarked, as Triton does
    assert tuned["config"] == {"BLOCK": 32, "num_warps": 1, "num_stages": 3}  # the stand-in's pick
    assert "user_triton_autotune:affine[n=1000," in log and "served (a miss); tuning it" in log

    fetched, log = run({"TUNECACHE_URL": server.url, **said})  # fresh: empty memo, no snapshot
    assert fetched == {"bench": 0, "config": tuned["config"]}
    assert "from the server (exact rule), no benchmarking" in log and "a miss" not in log

    with Client(server.url) as client:
        document, _ = client.export_snapshot(local_device("cpu").fingerprint.arch)
        records = client.list_records(kernel="tests.user_triton_autotune:affine")
    assert records.count == 1 and records.items[0].validation.passed
    # What the winner was checked against, in which dtype (no float64 reference here).
    assert records.items[0].validation.reference == "reference= (user function), float32"
    snapshot = tmp_path / "winners.json"
    assert document is not None
    save_snapshot(snapshot, document)
    offline, log = run({"TUNECACHE_URL": dead_url(), "TUNECACHE_SNAPSHOT": str(snapshot), **said})
    assert offline == {"bench": 0, "config": tuned["config"]}
    assert "from the snapshot file" in log


def test_a_tune_without_a_token_says_once_that_it_shares_nothing(server: LiveServer) -> None:
    tuned, stderr = run({"TUNECACHE_URL": server.url, "TUNECACHE_TOKEN": ""})
    assert tuned["bench"] == 6  # tuned here all the same
    assert stderr.count("not uploaded: no TUNECACHE_TOKEN (a write token shares") == 1, stderr
    with Client(server.url) as client:
        assert client.list_records().count == 0


def test_a_malformed_setting_never_breaks_the_users_code() -> None:
    """It is taken as unset, and only it: the server asked is still the one the environment
    names (all the settings fell back to their defaults, the URL and token with them)."""
    url = dead_url()
    env = {"TUNECACHE_URL": url, "TUNECACHE_TIMEOUT": "soon", "TEST_ON_MISS": "default"}
    result, stderr = run(env)
    assert result == {"bench": 0, "config": {"BLOCK": 16, "num_warps": 1, "num_stages": 3}}
    assert stderr.count("TUNECACHE_TIMEOUT='soon'") == 1 and "Traceback" not in stderr
    assert f"lookup at {url} failed" in stderr, stderr


def test_server_down_runs_the_first_config_after_one_warning() -> None:
    result, stderr = run({"TUNECACHE_URL": dead_url(), "TEST_ON_MISS": "default"})
    assert result == {"bench": 0, "config": {"BLOCK": 16, "num_warps": 1, "num_stages": 3}}
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "using default configs" in lines[0], stderr  # one warning


TIMED = """
import json, time, torch
import tests.user_triton_autotune as m
x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
started = time.monotonic()
m.launch(x)
print(json.dumps({"bench": len(m.BENCH_CALLS), "launch": time.monotonic() - started}))
"""


def test_the_upload_after_a_tune_never_delays_the_launch() -> None:
    """A server that takes forever to store a record: the tuned kernel launches at once (the
    upload waits in the background, then gives up at exit)."""
    from tests.hostile import serve, slow_writes

    with serve(slow_writes) as (url, seen):
        env = {**os.environ, "TRITON_INTERPRET": "1", "TUNECACHE_URL": url,
               "TUNECACHE_TOKEN": "a-write-token"}  # fmt: skip
        done = subprocess.run([sys.executable, "-c", TIMED], capture_output=True, text=True,
                              timeout=300, cwd=REPO, env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "POST /v1/records" in seen.requests, seen.requests  # it was sent, and held
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["bench"] == 6
    assert result["launch"] < 20, result  # the write timeout is 60 s: it did not wait for it


# -- a hostile server never gets a config launched -------------------------------------------
def _lookup_answer(config: dict[str, Any]) -> bytes:
    """A well-formed lookup answer for the kernel's key at n=1000, carrying ``config``."""
    import torch

    from tests.factories import make_record
    from tunecache.schemas import LookupResponse, RecordPublic
    from tunecache.triton.keys import KernelIdentity, key_of_call

    m = _kernel_module()
    x = torch.zeros(1000)
    key = key_of_call(KernelIdentity.of(m.affine.fn), ["n"], {"x_ptr": x, "y_ptr": x, "n": 1000})
    # Built from a servable record, then given ``config``: a hostile server sends anything.
    record = make_record(key, config={"BLOCK": 32}).model_dump(mode="json", by_alias=True)
    public = RecordPublic.model_validate({**record, "config": config, "id": 1,
                                          "key_hash": key.digest(),
                                          "created_at": "2026-01-01T00:00:00Z"})  # fmt: skip
    return LookupResponse(record=public).model_dump_json(by_alias=True).encode()


def _kernel_module() -> Any:
    import tests.user_triton_autotune as m

    return m


HOSTILE = {
    "wrong schema": lambda: b'{"record": {"config": {"BLOCK": 32}}}',
    "garbage bytes": lambda: bytes(range(256)) * 64,
    "50 MB answer": lambda: b'{"record": "' + b"x" * (50 * 2**20) + b'"}',
    "unknown meta-parameters": lambda: _lookup_answer({"BLOCK": 32, "EVIL": 1, "num_warps": 1}),
    "64 warps": lambda: _lookup_answer({"BLOCK": 32, "num_warps": 64, "num_stages": 3}),
    "a string for a block": lambda: _lookup_answer({"BLOCK": "32; rm -rf", "num_warps": 1}),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_servers_config_is_never_launched(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx
    import torch

    import tunecache.triton.autotuner as autotuner

    body = HOSTILE[case]()
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
    client = Client("http://hostile.invalid", transport=transport, token="")
    monkeypatch.setattr(autotuner, "shared_client", lambda *a: client)
    m = _kernel_module()
    monkeypatch.setattr(m.affine, "on_miss", "default")
    m.affine.cache.clear()
    m.BENCH_CALLS.clear()
    x = torch.randn(1000)
    assert torch.allclose(m.launch(x), x * 2 + 1)
    assert m.affine.best_config is m.CONFIGS[0]  # the first listed config, not the server's
    assert m.BENCH_CALLS == []


SHARED = """
import json, torch
import tests.user_triton_autotune as m
from tunecache.device import Device, DeviceFingerprint, DeviceLimits
from tunecache.triton.shared import shared_memory, shared_misfit
half, single = torch.empty(1, dtype=torch.float16), torch.empty(1, dtype=torch.float32)
arguments = {"a_ptr": half, "b_ptr": half, "c_ptr": single}
small = Device(DeviceFingerprint(kind="cuda", arch="sm_90", name="small-gpu", units=8),
               DeviceLimits("small-gpu", 16384, 1024, 8))
h100 = Device(DeviceFingerprint(kind="cuda", arch="sm_90", name="h100", units=132),
              DeviceLimits.H100)
wide = {"BLOCK": 128, "num_warps": 4, "num_stages": 3}
narrow = {**wide, "BLOCK": 32}
print(json.dumps([shared_misfit(m.dot_tile, arguments, wide, small),
                  shared_misfit(m.dot_tile, arguments, wide, h100),
                  shared_misfit(m.dot_tile, arguments, narrow, small),
                  # raises where the kernel does not compile: the Nones above are then no pass
                  shared_memory(m.dot_tile, arguments, wide, "sm_90"),
                  shared_memory(m.dot_tile, arguments, narrow, "sm_90")]))
"""


def test_a_config_over_the_devices_shared_memory_is_refused() -> None:
    """Sized by compiling for the GPU's target (no GPU needed): a 128-wide fp16 tile needs
    64 KiB, which an H100 holds and a 16 KiB device does not. In a fresh process: a real
    compile after an interpreted kernel in the same process fails (Triton 3.9's interpreter
    patches ``triton.language`` for good)."""
    done = subprocess.run([sys.executable, "-c", SHARED], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env={**os.environ, "TRITON_INTERPRET": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    wide_small, wide_h100, narrow_small, wide_bytes, narrow_bytes = json.loads(
        done.stdout.splitlines()[-1]
    )
    assert wide_bytes == 65536 and 0 < narrow_bytes <= 16384  # compiled, and sized
    assert wide_small is not None and "65536 bytes of shared memory" in wide_small
    assert "16384" in wide_small
    assert wide_h100 is None and narrow_small is None


def _compile_error(kind: str) -> Exception:
    """A compile error of ``kind``, as Triton raises it."""
    import ast

    from triton.compiler.errors import CompilationError, CompileTimeAssertionFailure
    from triton.runtime.errors import OutOfResources, PTXASError

    source = "def kernel(BLOCK):\n    tl.static_assert(BLOCK >= 262144)\n"
    node = ast.parse(source).body[0].body[0]  # type: ignore[attr-defined]
    return {"out_of_resources": lambda: OutOfResources(262144, 232448, "shared memory"),
            "static_assert": lambda: CompileTimeAssertionFailure(source, node, None),
            "ptxas": lambda: PTXASError("ptxas: 262144 registers"),
            "compile": lambda: CompilationError(source, node, "262144 is not a tensor")}[kind]()  # fmt: skip


@pytest.mark.parametrize(
    ("raised", "refused"),
    [
        ("out_of_resources", True),
        # what Triton's own autotuner times as infinitely slow (never picks): refused too
        ("static_assert", True),
        ("ptxas", True),
        ("compile", False),  # any other compile error: the launch will say why
        # a compile error whose text mentions shared memory (a kernel's docstring): no verdict
        (RuntimeError("CompilationError: the shared memory note in the docstring"), False),
    ],
)
def test_a_misfit_is_told_by_the_errors_type_not_its_words(
    raised: Any, refused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tunecache.device import Device, DeviceFingerprint, DeviceLimits
    from tunecache.triton import shared

    error = _compile_error(raised) if isinstance(raised, str) else raised

    def compile_fails(*args: Any) -> int:
        raise error

    monkeypatch.setattr(shared, "shared_memory", compile_fails)
    h100 = Device(DeviceFingerprint(kind="cuda", arch="sm_90", name="h100", units=132),
                  DeviceLimits.H100)  # fmt: skip
    why = shared.shared_misfit(lambda: None, {}, {"BLOCK": 256}, h100)
    assert (why is not None) == refused
    if refused:
        assert why is not None and "262144" in why


ROWS = """
import json, torch
import tests.user_triton_autotune as m
x = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))[:, :100]  # padded views
y = torch.full((64, 160), -7.0)[:, :100]
m.launch_rows(x, y)
assert torch.equal(y, x * 2 + 1), "wrong result"
print(json.dumps({"bench": len(m.BENCH_CALLS)}))
"""


def test_a_padded_view_is_checked_in_memory_shaped_like_the_callers(server: LiveServer) -> None:
    """The check of a winner, and ``verify="first"`` of a served one, run the kernel on copies of
    the arguments. The kernel is passed the caller's row strides (128 and 160 over 100 columns):
    compact copies would be read and written past their ends."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "TUNECACHE_URL": server.url}
    for verify, bench in (("never", 3), ("first", 0)):
        done = subprocess.run([sys.executable, "-c", ROWS], capture_output=True, text=True,
                              timeout=300, cwd=REPO, env={**env, "TEST_VERIFY": verify})  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.splitlines()[-1]) == {"bench": bench}
        assert "validation" not in done.stderr and "disput" not in done.stderr, done.stderr
    with Client(server.url) as client:
        records = client.list_records(kernel="tests.user_triton_autotune:affine_rows")
    (record,) = records.items
    assert record.validation.passed and not record.disputes
    assert record.status in ("pending", "verified")


def test_a_check_that_cannot_run_here_never_breaks_the_launch_nor_disputes(
    server: LiveServer,
) -> None:
    """A reference that fails (as it does short of device memory) says nothing of the config: the
    user's launch still returns, a served record is neither used unchecked nor disputed, and a
    winner tuned here is not uploaded unchecked."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "TUNECACHE_URL": server.url}
    runs = (("never", "", 3), ("first", "1", 3))  # tunes and uploads; then cannot check: tunes
    for verify, fails, bench in runs:
        done = subprocess.run([sys.executable, "-c", ROWS], capture_output=True, text=True,
                              timeout=300, cwd=REPO,
                              env={**env, "TEST_VERIFY": verify, "TEST_REFERENCE_FAILS": fails})  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.splitlines()[-1]) == {"bench": bench}
    assert "could not check the server's config here" in done.stderr, done.stderr
    assert "not disputing it" in done.stderr and "could not check the tuned config" in done.stderr
    assert "run unchecked, as Triton's own pick; not uploaded" in done.stderr
    assert "CUDA out of memory" in done.stderr and "Traceback" not in done.stderr
    with Client(server.url) as client:
        records = client.list_records(kernel="tests.user_triton_autotune:affine_rows")
    (record,) = records.items  # the second process uploaded nothing
    assert not record.disputes and record.status in ("pending", "verified")


WRONG_PICK = """
import json, torch
import tests.user_triton_autotune as m
x = torch.randn(4, 100, generator=torch.Generator().manual_seed(0))
first = m.launch_max(x)  # the call that tunes: Triton picks BLOCK=16, wrong over 100 columns
print(json.dumps({"first_right": bool(torch.equal(first, x.max(dim=1).values)),
                  "config": m.row_max.best_config.kwargs, "bench": len(m.BENCH_CALLS)}))
"""


def test_a_pick_that_fails_validation_never_runs_into_the_callers_tensors() -> None:
    """The tuned winner is checked before Triton launches it into the call being tuned: the
    caller's first result came from BLOCK=16 (wrong) while the warning said the first config
    was used."""
    # No server (malformed URL): the miss is tuned here (a down server would tune nothing).
    env = {**os.environ, "TRITON_INTERPRET": "1", "TUNECACHE_URL": "htp://x"}
    done = subprocess.run([sys.executable, "-c", WRONG_PICK], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "first_right": True,
        "config": {"BLOCK": 128},
        "bench": 3,
    }
    assert "failed validation (relative error" in done.stderr
    assert "this call and the later ones launch BLOCK: 128" in done.stderr


def test_a_kernel_has_one_key_however_its_file_is_run(tmp_path: Path) -> None:
    """``python rowmax.py`` named it ``__main__:rowmax`` and ``import rowmax`` ``rowmax:rowmax``:
    the same kernel was tuned and stored twice."""
    (tmp_path / "rowmax.py").write_text(
        "import triton, triton.language as tl\n"
        "from tunecache.triton.keys import KernelIdentity\n"
        "@triton.jit\n"
        "def rowmax(x_ptr, BLOCK: tl.constexpr):\n"
        "    pass\n"
        "if __name__ == '__main__':\n"
        "    print(KernelIdentity.of(rowmax).name)\n"
    )
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "rowmax.py").write_text((tmp_path / "rowmax.py").read_text())
    imported = "import rowmax; from tunecache.triton.keys import KernelIdentity as K; " \
               "print(K.of(rowmax.rowmax).name)"  # fmt: skip
    names = []
    for argv in (["rowmax.py"], ["-c", imported], ["-m", "pkg.rowmax"]):
        done = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr
        names.append(done.stdout.strip())
    assert names == ["rowmax:rowmax", "rowmax:rowmax", "pkg.rowmax:rowmax"]
