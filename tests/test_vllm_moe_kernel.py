"""vLLM's own fused-MoE kernel tuned here and served to the engine as its config files.

The engine is vLLM as published (``.ci/vllm.sh`` installs it into ``.vllm/``), run in a
subprocess (:mod:`tests.vllm_moe_run`) under Triton's interpreter: its ``fused_moe_kernel`` is
tuned as ``workloads.vllm_moe:FusedMoE`` and uploaded; ``tunecache sync --format vllm-moe`` writes
the winner as the engine's file; the engine's own lookup (``VLLM_TUNED_CONFIG_FOLDER``) takes that
config and its kernel, launched with it, matches the reference. Without ``.vllm/`` these tests
skip (CI fails instead).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LiveServer
from tests.factories import make_record
from tunecache.device import DeviceFingerprint as Device
from tunecache.errors import InvalidInput
from tunecache.key import Key
from tunecache.manifest import parse_manifest
from tunecache.presets import ENGINE_BATCH_SIZES, preset_problems
from tunecache.schemas import RecordPublic
from tunecache.vllm_moe import KERNEL, engine_device_name
from tunecache.vllm_moe_tuned import tuned_files

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / ".vllm"
CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
          "num_warps": 4, "num_stages": 2}  # fmt: skip
MIXTRAL_TP2 = {"M": 16, "E": 8, "N": 7168, "K": 4096, "topk": 2}
# 3 stages of (128x128 + 128x64) bfloat16 tiles: 144 KiB of shared memory.
BIG_TILES = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 16,
             "num_warps": 8, "num_stages": 3}  # fmt: skip
ROCM = Device(kind="rocm", arch="gfx942", name="NVIDIA H100 80GB HBM3", units=304)  # as named
L40S = Device(kind="cuda", arch="sm_89", name="NVIDIA L40S", units=142)
H100 = Device(kind="cuda", arch="sm_90", name="NVIDIA H100 80GB HBM3", units=132)


def _engine(
    *args: str, env: dict[str, str] | None = None, interpret: bool = True
) -> dict[str, Any]:
    if not (ENGINE / ".complete").exists():
        if os.environ.get("CI"):
            pytest.fail("CI needs vLLM in .vllm/: bash .ci/vllm.sh")
        pytest.skip("vLLM is not in .vllm/ (bash .ci/vllm.sh installs it)")
    base = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-m", "tests.vllm_moe_run", *args],
        env={**base, "PYTHONPATH": f"{ENGINE}{os.pathsep}{ROOT}", "CUDA_VISIBLE_DEVICES": "",
             **({"TRITON_INTERPRET": "1"} if interpret else {}), **(env or {})},
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    found: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    found["log"] = run.stderr
    return found


@pytest.mark.slow
def test_the_engines_kernel_is_tuned_written_as_its_file_and_taken_by_the_engine(
    server: LiveServer, tmp_path: Path
) -> None:
    tuned = _engine("tune", server.url)
    # The engine's own kernel, not one of ours: vLLM's module defines it.
    assert tuned["kernel"] == "vllm.model_executor.layers.fused_moe.fused_moe:fused_moe_kernel"
    assert tuned["passed"] and tuned["ok_trials"] >= 4
    assert "default_config" in tuned["baselines"]  # the engine's untuned default, timed
    device = engine_device_name(tuned["device"])
    folder = tmp_path / "moe-configs"
    synced = subprocess.run(
        [sys.executable, "-m", "tunecache_cli", "sync", "--format", "vllm-moe", "-o", str(folder),
         "--device", device, "--server", server.url],
        capture_output=True, text=True,
    )  # fmt: skip
    assert synced.returncode == 0, synced.stderr
    assert "1 file (1 entries: 1 tuned, 0 imported)" in synced.stderr
    written = folder / f"E=4,N=32,device_name={device}.json"
    assert [p.name for p in folder.iterdir()] == [written.name]
    document = json.loads(written.read_text())
    assert document["4"] == tuned["config"] and list(document["4"]) == list(CONFIG)
    assert document["triton_version"]  # as the engine's tuner writes it
    taken = _engine("read", device, env={"VLLM_TUNED_CONFIG_FOLDER": str(folder)})
    assert {k: v for k, v in taken["config"].items() if k != "SPLIT_K"} == tuned["config"]
    assert "Using default MoE config" not in taken["log"]
    assert taken["rel_error"] <= taken["tolerance"]
    # A token among many experts: the engine's naive assignment (a block per token and expert).
    assert taken["naive_rel_error"] <= taken["tolerance"]


@pytest.mark.slow
def test_without_a_file_the_engine_runs_its_default_and_says_so(tmp_path: Path) -> None:
    taken = _engine("read", "NO_SUCH_GPU", env={"VLLM_TUNED_CONFIG_FOLDER": str(tmp_path)})
    assert "Using default MoE config" in taken["log"]  # what the users see
    assert taken["rel_error"] <= taken["tolerance"]


@pytest.mark.slow
def test_the_compile_farm_compiles_the_engines_kernels_for_a_gpu_without_one(
    tmp_path: Path,
) -> None:
    """A farm process (no GPU, CUDA_VISIBLE_DEVICES empty, as vLLM keeps Triton there) runs the
    engine's own launch code, and both its kernel launches compile for sm_90 and launch nothing."""
    config = {**CONFIG, "BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "num_stages": 3}
    facts = _engine("compile", json.dumps(config), interpret=False,
                    env={"TRITON_CACHE_DIR": str(tmp_path / "triton-cache")})  # fmt: skip
    assert facts["kernels"] == 2 and facts["compiled"] == 2  # gate-up and down: two variants
    # Three stages of a 64x64 A tile and a 64x128 B tile in bfloat16, as the compiler counts them.
    assert 3 * (64 * 64 + 64 * 128) * 2 <= facts["shared"] <= 232448


def _record(
    *,
    kernel: str = KERNEL,
    problem: dict[str, int] | None = None,
    dtype: str = "bfloat16",
    config: dict[str, Any] | None = None,
    device: Device = H100,
    passed: bool = True,
    status: str = "pending",
    age_s: float = 0.0,
    naive: bool = False,
) -> RecordPublic:
    key = Key(kernel=kernel, source_hash="0123456789abcdef", backend="triton",
              problem=problem or MIXTRAL_TP2, dtype=dtype,
              device=device, environment={"triton": "3.6.0"})  # fmt: skip
    created = make_record(key, passed=passed, config=dict(CONFIG)).model_dump(mode="json")
    when = datetime(2026, 11, 27, tzinfo=None if naive else UTC) + timedelta(seconds=age_s)
    # As a server sends it: parsed as stored (the config unchecked, as a hostile server's may be).
    return RecordPublic.model_validate({**created, "config": config or dict(CONFIG), "id": 1,
                                        "key_hash": "0" * 64, "status": status,
                                        "created_at": when.isoformat()})  # fmt: skip


def test_only_served_winners_of_the_engines_kernel_for_the_device_become_entries() -> None:
    bigger = {**CONFIG, "BLOCK_SIZE_M": 64}
    records = [
        _record(),
        _record(problem={**MIXTRAL_TP2, "M": 32}, config=bigger),
        _record(kernel="mypkg.kernels:Other"),  # another kernel
        _record(passed=False, problem={**MIXTRAL_TP2, "M": 1}),
        _record(status="disputed", problem={**MIXTRAL_TP2, "M": 2}),
        _record(config={**CONFIG, "num_warps": 3}, problem={**MIXTRAL_TP2, "M": 4}),
        _record(config={**CONFIG, "pre_hook": 1}, problem={**MIXTRAL_TP2, "M": 8}),
        _record(device=Device(kind="cuda", arch="sm_90", name="NVIDIA H200", units=132)),
        # Inside the file's ranges, outside what the engine's tuner tries:
        _record(config={**CONFIG, "BLOCK_SIZE_M": 512}, problem={**MIXTRAL_TP2, "M": 64}),
        # Tiles that fit an H100's 227 KiB of shared memory but not an L40S's 99 KiB:
        _record(config=BIG_TILES, problem={**MIXTRAL_TP2, "M": 128}),
        _record(config=BIG_TILES, device=L40S, problem={**MIXTRAL_TP2, "M": 128}),
        # ROCm's fields: in the file schema, but the engine's CUDA launch refuses them.
        _record(config={**CONFIG, "kpack": 2}, problem={**MIXTRAL_TP2, "M": 256}),
        _record(device=ROCM, problem={**MIXTRAL_TP2, "M": 512}),  # another platform's device
    ]
    files, skipped = tuned_files(records, "NVIDIA_H100_80GB_HBM3")
    assert skipped == 10
    [(shape, contents)] = files.items()
    assert shape.file_name() == "E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json"
    assert contents.table == {16: CONFIG, 32: bigger, 128: BIG_TILES}
    assert contents.triton_version == "3.6.0"
    assert tuned_files(records, "NVIDIA_L40S") == ({}, len(records))
    h200, _ = tuned_files(records, "NVIDIA_H200")
    assert [s.file_name() for s in h200] == ["E=8,N=7168,device_name=NVIDIA_H200.json"]


def test_bfloat16_then_the_newest_record_gives_a_batch_sizes_entry() -> None:
    other = {**CONFIG, "BLOCK_SIZE_N": 128}
    newest = {**CONFIG, "BLOCK_SIZE_N": 256}
    fp16 = _record(dtype="float16", config=other, age_s=100)
    old = _record(config=CONFIG, age_s=0)
    other_model = _record(problem={**MIXTRAL_TP2, "K": 6144}, config=newest, age_s=50)
    files, _ = tuned_files([fp16, old, other_model], "NVIDIA_H100_80GB_HBM3")
    assert [c.table for c in files.values()] == [{16: newest}]
    files, _ = tuned_files([fp16], "NVIDIA_H100_80GB_HBM3")
    assert [c.table for c in files.values()] == [{16: other}]
    # A server's times with and without a zone (read as UTC) are still ordered, not a crash.
    files, _ = tuned_files(
        [old, _record(config=other, age_s=10, naive=True)], "NVIDIA_H100_80GB_HBM3"
    )
    assert [c.table for c in files.values()] == [{16: other}]


def test_the_engines_device_names() -> None:
    assert engine_device_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3"
    assert engine_device_name("NVIDIA H200 NVL") == "NVIDIA_H200"
    assert engine_device_name("NVIDIA A100-SXM4-80GB") == "NVIDIA_A100-SXM4-80GB"
    assert engine_device_name("AMD Instinct MI300X/VF") == "AMD_Instinct_MI300X_VF"


def test_a_moe_preset_queues_the_engines_kernel_at_its_batch_sizes_and_degrees() -> None:
    problems = preset_problems("qwen3-30b-a3b-moe", tp=2)[KERNEL]
    assert [p["M"] for p in problems] == list(ENGINE_BATCH_SIZES)
    assert problems[0] == {"M": 1, "E": 128, "N": 384, "K": 2048, "topk": 8}  # vLLM's E=128,N=384
    manifest = parse_manifest('arch = "sm_90"\n[[tune]]\npreset = "mixtral-8x7b-moe"\n'
                              'tokens = [16]\ntp = [1, 2]\nbackends = ["triton"]\n'
                              'dtypes = ["bfloat16"]\n')  # fmt: skip
    assert sorted(k.problem["N"] for k in manifest.keys) == [7168, 14336]
    assert {k.kernel for k in manifest.keys} == {KERNEL}
    for bad, words in [({"tokens": []}, "tokens is empty"), ({"tp": 3}, "does not divide"),
                       ({"tokens": [0]}, "not a positive integer")]:  # fmt: skip
        with pytest.raises(InvalidInput, match=words):
            preset_problems("mixtral-8x7b-moe", **bad)  # type: ignore[arg-type]
