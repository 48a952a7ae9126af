"""Kernels are values: keys for the device a kernel runs on, users' own kernels by
``"module:qualname"`` through the one pipeline, every candidate measured in a worker, and one
harness reused across keys."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import tunecache
from backends import Budget
from tests.conftest import LiveServer
from tunecache import Device, InvalidInput, get_kernel, key_for
from tunecache.client import Client
from tunecache.device import local_device
from tunecache.timing import TimerSettings
from tuner import TuneOptions, tune

REPO = Path(__file__).resolve().parent.parent
QUICK = TimerSettings(warmup=1, min_repeats=3, max_repeats=5, target_s=0.01)
AFFINE = "tests.user_kernels:AffineRows"
GEMM = {"M": 16, "N": 6144, "K": 4096}


def cuda_props(name: str, major: int, minor: int, sms: int, gib: int, smem: int) -> SimpleNamespace:
    return SimpleNamespace(name=name, major=major, minor=minor, multi_processor_count=sms,
                           total_memory=gib * 2**30, shared_memory_per_block_optin=smem,
                           max_threads_per_block=1024, warp_size=32)  # fmt: skip


H100 = Device.from_cuda_properties(cuda_props("NVIDIA H100 80GB HBM3", 9, 0, 132, 80, 232448))
A100 = Device.from_cuda_properties(cuda_props("NVIDIA A100-SXM4-80GB", 8, 0, 108, 80, 166912))


def test_a_triton_key_names_the_gpu_never_the_host_cpu() -> None:
    h100 = key_for("matmul", "triton", GEMM, "bfloat16", device=H100)
    a100 = key_for("matmul", "triton", GEMM, "bfloat16", device=A100)
    assert h100.digest() != a100.digest()
    assert (h100.device.arch, a100.device.arch) == ("sm_90", "sm_80")
    cpu = local_device("cpu").fingerprint
    for key in (h100, a100):
        assert key.device.kind == "cuda" and key.device != cpu
        assert cpu.name not in json.dumps(key.to_json())  # nothing of the host CPU in the key
    assert H100.limits is not None and H100.limits.max_shared_memory_per_block == 232448


def test_a_triton_key_without_a_gpu_is_refused_not_stamped_with_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The regression: keys were built with the host CPU whatever the backend."""
    if _has_cuda():
        pytest.skip("a CUDA device is visible: the key names it")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(InvalidInput, match="no CUDA device is visible"):
        key_for("matmul", "triton", GEMM, "bfloat16")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter runs kernels on this CPU
    assert key_for("matmul", "triton", GEMM, "bfloat16").device.kind == "cpu"
    assert key_for("matmul", "inductor", GEMM, "float32", device="cpu").device.kind == "cpu"


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_tune_refuses_a_key_that_is_not_this_machines() -> None:
    h100 = key_for("matmul", "tvm", {"M": 8, "N": 8, "K": 8}, "float32", device=H100)
    with pytest.raises(InvalidInput, match="cuda"):
        tune(h100, Budget(trials=1))
    here = key_for("matmul", "tvm", {"M": 8, "N": 8, "K": 8}, "float32")
    other_cpu = Device(tunecache.DeviceFingerprint(kind="cpu", arch="cpu-neon", name="graviton3",
                                                   units=64))  # fmt: skip
    elsewhere = key_for("matmul", "tvm", {"M": 8, "N": 8, "K": 8}, "float32", device=other_cpu)
    with pytest.raises(InvalidInput, match="graviton3"):
        tune(elsewhere, Budget(trials=1))
    stale = dataclasses.replace(here, source_hash="0" * 16)
    with pytest.raises(InvalidInput, match="source hash"):
        tune(stale, Budget(trials=1))


def test_a_users_kernel_is_named_by_module_and_qualname() -> None:
    spec = get_kernel(AFFINE)
    assert spec.name == AFFINE and spec.params == ("M", "N") and spec.bucket == ("M",)
    key = key_for(AFFINE, "inductor", {"M": 8, "N": 24}, "float32")
    assert key.kernel == AFFINE and len(key.source_hash) == 16
    assert spec.problem_from_args(SimpleNamespace(shape=(8, 24))) == {"M": 8, "N": 24}
    with pytest.raises(InvalidInput, match="takes 1 tensors"):
        spec.problem_from_args()
    with pytest.raises(InvalidInput, match="supports dtypes"):
        key_for(AFFINE, "triton", {"M": 8, "N": 24}, "float16")
    # Another name of a supported dtype is pointed at its name here; an unknown one is not.
    for typed in ("fp32", "torch.float32", "Float32 "):
        with pytest.raises(InvalidInput, match=r"not '.*' \(did you mean 'float32'\?\)$"):
            key_for(AFFINE, "tvm", {"M": 8, "N": 24}, typed)
    with pytest.raises(InvalidInput, match=r"not 'bf16'$"):  # tvm: float32 only
        key_for(AFFINE, "tvm", {"M": 8, "N": 24}, "bf16")
    with pytest.raises(InvalidInput, match=r"did you mean 'bfloat16'"):
        key_for("matmul", "triton", {"M": 8, "N": 8, "K": 8}, "bf16")
    # A package not on sys.path (a script run from another folder than the package's): says so.
    with pytest.raises(InvalidInput, match=r"'no_such_package_9' on sys\.path.*PYTHONPATH"):
        key_for("no_such_package_9.kernels:K", "tvm", {"M": 8}, "float32")


def test_the_run_time_path_imports_only_tunecache(tmp_path: Path) -> None:
    """A user project with folders named like ours (workloads/, tuner/) cannot shadow them."""
    for folder in ("workloads", "tuner", "backends"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("raise ImportError('the user folder')\n")
    code = (
        "import sys, tunecache\n"
        "key = tunecache.key_for('matmul', 'tvm', {'M': 64, 'N': 64, 'K': 64}, 'float32')\n"
        "heavy = {m.split('.')[0] for m in sys.modules} & "
        "{'workloads', 'backends', 'tuner', 'cache_server', 'optuna', 'fastapi', 'sqlalchemy'}\n"
        "print(key.source_hash, sorted(heavy))\n"
    )
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    expected = key_for("matmul", "tvm", {"M": 64, "N": 64, "K": 64}, "float32").source_hash
    assert done.stdout.split() == [expected, "[]"]


# -- the one pipeline, for users' kernels and through the harness -----------------------------
def _round_trip(server: LiveServer, outcome: tunecache.Key | object) -> None:
    record = outcome.record  # type: ignore[attr-defined]
    key = outcome.key  # type: ignore[attr-defined]
    assert record.validation.passed and record.key.kernel == AFFINE
    with Client(server.url) as client:
        client.upload(record)
        fetched = client.fetch(key)
    assert fetched is not None and fetched.config == record.config


@pytest.mark.slow
def test_a_users_inductor_kernel_tunes_and_round_trips_from_the_command_line(
    server: LiveServer,
) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tunecache_cli", *args, "--backend",
                               "inductor", "--shape", "M=8,N=24", "--server", server.url],
                              capture_output=True, text=True, timeout=600, cwd=REPO)  # fmt: skip

    tuned = cli("tune", AFFINE, "--trials", "2")
    assert tuned.returncode == 0, tuned.stderr
    got = cli("get", AFFINE, "--json")
    assert got.returncode == 0, got.stderr
    record = json.loads(got.stdout)["record"]
    assert record["key"]["kernel"] == AFFINE and record["validation"]["passed"]
    assert {b["name"] for b in record["baselines"]} >= {"torch_eager"}


@pytest.mark.slow
def test_a_users_tvm_kernel_goes_through_meta_schedule_and_the_harness(
    server: LiveServer, tmp_path: Path
) -> None:
    pytest.importorskip("tvm")
    key = key_for(AFFINE, "tvm", {"M": 8, "N": 24}, "float32")
    outcome = tune(key, Budget(trials=4), TuneOptions(workdir=tmp_path, timer=QUICK, workers=1))
    assert outcome.record.search.strategy == "meta_schedule"
    _round_trip(server, outcome)


@pytest.mark.slow
def test_a_users_triton_kernel_under_the_interpreter_with_a_test_timer(server: LiveServer) -> None:
    pytest.importorskip("triton")
    if _has_cuda():
        pytest.skip("a CUDA device is visible: this test is for the interpreter")
    key = key_for(AFFINE, "triton", {"M": 8, "N": 24}, "float32")
    assert key.device.kind == "cpu"  # the interpreter runs the kernel on this CPU
    options = TuneOptions(strategy="exhaustive", timer=QUICK, workers=2,
                          timer_ref="tests.user_kernels:stand_in_timer")  # fmt: skip
    outcome = tune(key, Budget(trials=6), options)
    assert len([t for t in outcome.trials if t.status == "ok"]) >= 6
    assert outcome.record.timing.timer.startswith("test timer")
    _round_trip(server, outcome)


@pytest.mark.slow
def test_a_segfaulting_candidate_of_a_backends_own_search_is_recorded(tmp_path: Path) -> None:
    from tests.faulty_backend import FaultyNativeTVM, knob

    key = key_for("matmul", "tvm", {"M": 16, "N": 16, "K": 16}, "float32")
    options = TuneOptions(backend_ref="tests.faulty_backend:FaultyNativeTVM", workers=1,
                          timer=QUICK, workdir=tmp_path, run_timeout=10)  # fmt: skip
    outcome = tune(key, Budget(trials=2), options, backend=FaultyNativeTVM())
    record = outcome.record
    assert record.search.strategy == "faulty_search"
    assert record.config == knob("ok") and record.validation.passed
    crashed = [t for t in record.trials if t.config == knob("segfault") and t.status != "ok"]
    assert crashed and crashed[0].status == "runtime_error" and "SIGSEGV" in crashed[0].error
    assert not outcome.rejected  # it died in its re-timing, before it could be validated


@pytest.mark.slow
def test_one_harness_tunes_six_keys_with_its_workers_started_once(tmp_path: Path) -> None:
    from tests.faulty_backend import FaultyTVM, mode_of
    from tuner.harness import Harness

    options = TuneOptions(strategy="exhaustive", backend_ref="tests.faulty_backend:FaultyTVM",
                          timer=QUICK, workdir=tmp_path)  # fmt: skip
    configs = []
    with Harness(workers=2, run_timeout=10) as harness:
        for m in (8, 16, 24, 32, 40, 48):
            key = key_for("matmul", "tvm", {"M": m, "N": 16, "K": 16}, "float32")
            outcome = tune(key, Budget(trials=2), options, harness=harness, backend=FaultyTVM())
            assert outcome.record.key.problem["M"] == m and outcome.record.validation.passed
            configs.append(mode_of(outcome.record.config))
        started = harness.started
    assert started == 2  # two workers, started once for all six keys
    assert configs == ["ok"] * 6


@pytest.mark.slow
def test_the_command_line_and_its_workers_never_import_a_users_folder_named_like_ours(
    tmp_path: Path,
) -> None:
    """Run from a project with folders named like our packages, ``tunecache tune`` (whose
    measurement workers are spawned processes) imports none of them: ours come first."""
    for folder in ("tuner", "backends", "workloads", "cache_server"):
        (tmp_path / folder).mkdir()
        marker = tmp_path / f"imported-{folder}"
        (tmp_path / folder / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    command = Path(sys.executable).parent / "tunecache"
    done = subprocess.run([str(command), "tune", "matmul", "--backend", "tvm", "--dtype",
                           "float32", "--shape", "M=16,N=16,K=16", "--trials", "2", "--strategy",
                           "random", "--workers", "1", "--no-upload"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.glob("imported-*")) == []


def test_a_backend_listed_without_its_hook_is_named_as_the_users_slip() -> None:
    """A user's workload that lists tvm but defines no ``tvm_compute`` failed mid-search with
    "internal error: ModuleNotFoundError: No module named 'mykern.tvm'", exit 1."""
    from tests.user_kernels import NoTvmHook

    with pytest.raises(InvalidInput, match=r"NoTvmHook lists 'tvm' in backend_dtypes but "
                       r"defines no tvm_compute\(\), and there is no module "
                       r"tests\.user_kernels\.tvm"):  # fmt: skip
        NoTvmHook().tvm_compute({"M": 8}, "float32")
