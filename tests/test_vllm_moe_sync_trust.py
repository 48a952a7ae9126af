"""``sync --format vllm-moe`` against a real server: what goes in a device's file is judged by the
device the file is for, never by what a record or an imported file says of itself
(tunecache/vllm_moe.py ``EngineDevice``, tunecache/vllm_moe_tuned.py, tunecache_cli/sync_moe.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import LiveServer
from tests.factories import make_record
from tunecache.client import Client
from tunecache.device import Device, DeviceFingerprint
from tunecache.key import Key
from tunecache.vllm_moe import KERNEL

SMALL = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
         "num_warps": 4, "num_stages": 2}  # fmt: skip
# Two stages of 128x128 A and B tiles in bfloat16: 131072 B, over an A10's (sm_86) 101376 B and
# under the interpreter's (an H100's) 232448 B.
BIG = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 16,
       "num_warps": 8, "num_stages": 2}  # fmt: skip
H100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132,
                       total_memory=80 * 2**30, shared_memory_per_block_optin=232448)  # fmt: skip


def cli(*argv: str) -> int:
    from tunecache_cli import main

    return main(list(argv))


def cpu_device(name: str) -> DeviceFingerprint:
    """A CPU named ``name`` as its key names it: where Triton's interpreter runs (H100 limits)."""
    return DeviceFingerprint(kind="cpu", arch="cpu-avx512", name=name, units=4)


def upload(url: str, device: DeviceFingerprint, m: int, config: dict[str, int]) -> None:
    """A winner of the engine's kernel at batch size ``m`` (E=8, N=1024), keyed to ``device``:
    what any write token may send."""
    key = Key(kernel=KERNEL, source_hash="3851f292d3915573", backend="triton",
              problem={"M": m, "E": 8, "N": 1024, "K": 1024, "topk": 2}, dtype="bfloat16",
              device=device, environment={"triton": "3.6.0"})  # fmt: skip
    with Client(url) as client:
        client.upload(make_record(key, config=dict(config)))


def sync(url: str, out: Path, *argv: str) -> int:
    return cli("sync", "--format", "vllm-moe", "-o", str(out), *argv, "--server", url)


def written(out: Path) -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in out.iterdir()} if out.exists() else {}


def one_file(device: str, entries: dict[str, dict[str, int]]) -> dict[str, dict[str, Any]]:
    """What ``written`` reads where a sync wrote ``device``'s one file (E=8, N=1024) of
    ``entries`` (batch size: config)."""
    return {f"E=8,N=1024,device_name={device}.json": {"triton_version": "3.6.0", **entries}}


def assert_synced(url: str, out: Path, device: str, entries: dict[str, dict[str, int]]) -> None:
    """``sync --device device`` into ``out`` succeeds, writing ``device``'s one file of
    ``entries`` and nothing else."""
    assert sync(url, out, "--device", device) == 0
    assert written(out) == one_file(device, entries)


def test_a_gpus_file_takes_only_its_own_kind_and_arch_and_its_own_limits(
    server: LiveServer, tmp_path: Path, capsys: Any
) -> None:
    a10 = DeviceFingerprint(kind="cuda", arch="sm_86", name="a10", units=72, memory_gb=24)
    upload(server.url, a10, 8, SMALL)  # honest and fitting: the file's one entry
    upload(server.url, a10, 16, BIG)  # honest, over the A10's shared memory: skipped
    # Forged keys for the same GPU: a CPU's kind (the interpreter's H100 limits) under the GPU's
    # name as torch gives it and as the engine writes it, and a CUDA key claiming an H100's arch.
    for m, name in [(32, "NVIDIA A10"), (64, "NVIDIA_A10")]:
        upload(server.url, cpu_device(name), m, BIG)
    upload(server.url, DeviceFingerprint(kind="cuda", arch="sm_90", name="a10", units=72), 128, BIG)
    assert_synced(server.url, tmp_path / "moe", "NVIDIA_A10", {"8": SMALL})
    assert "skipped 4" in capsys.readouterr().err
    # The interpreter's use stays: a CPU's records, in a file named for that CPU as its key names
    # it (tests/test_vllm_moe_kernel.py has the engine read it), held to the H100 limits it runs.
    upload(server.url, cpu_device("intel-xeon-8481c"), 16, BIG)
    assert_synced(server.url, tmp_path / "cpu", "intel-xeon-8481c", {"16": BIG})


def test_a_gpu_whose_name_tells_no_arch_takes_its_records_within_every_archs_limit(
    server: LiveServer, tmp_path: Path, capsys: Any
) -> None:
    """Named by ``--device``, a GPU missing from the families known here took no tuned record
    at all (a T4's, a V100's, any new one's): it takes its own name's CUDA records, held to the
    shared memory every arch gives a block (64 KiB). A T4 is known by its Tesla name."""
    foo = DeviceFingerprint(kind="cuda", arch="sm_89", name="foo-x9", units=40)
    upload(server.url, foo, 8, SMALL)
    upload(server.url, foo, 16, BIG)  # 131072 B: over what every arch gives
    assert_synced(server.url, tmp_path / "foo", "NVIDIA_Foo_X9", {"8": SMALL})
    assert "skipped 1" in capsys.readouterr().err
    t4 = DeviceFingerprint(kind="cuda", arch="sm_75", name="tesla-t4", units=40)
    upload(server.url, t4, 8, SMALL)
    assert_synced(server.url, tmp_path / "t4", "Tesla_T4", {"8": SMALL})


def test_a_winner_keyed_as_a_gpu_keys_itself_reaches_the_file_the_engine_reads(
    server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    h100 = Device.from_cuda_properties(H100).fingerprint
    assert h100.name == "h100-80gb-hbm3"  # what a CUDA key holds: the normalised name
    upload(server.url, h100, 16, SMALL)
    named = "NVIDIA_H100_80GB_HBM3"  # vLLM's own name for it
    assert_synced(server.url, tmp_path / "named", named, {"16": SMALL})
    # The key's own spelling is not a name the engine reads: no file under it.
    assert sync(server.url, tmp_path / "slug", "--device", "h100-80gb-hbm3") == 1
    assert written(tmp_path / "slug") == {}
    # Without --device: this machine's GPU, named as vLLM names it, arch from torch.
    cuda = SimpleNamespace(is_available=lambda: True, get_device_name=lambda i=0: H100.name,
                           get_device_properties=lambda i=0: H100)  # fmt: skip
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda, version=SimpleNamespace()))
    out = tmp_path / "here"
    assert sync(server.url, out) == 0
    assert written(out) == one_file(named, {"16": SMALL})
    assert "NVIDIA_H100_80GB_HBM3: wrote 1 file (1 entries: 1 tuned, 0 imported)" in (
        capsys.readouterr().err
    )


def imported_synced(url: str, folder: Path, capsys: Any, other: str) -> tuple[Path, str]:
    """Imports ``folder``'s files, then syncs them for an H100 and ``other`` with
    ``--accept imported`` into a folder beside it: that folder, and what the sync said."""
    assert cli("import", "vllm-moe", str(folder), "--server", url) == 0
    capsys.readouterr()
    out = folder.parent / "moe"
    assert sync(url, out, "--device", "NVIDIA_H100_80GB_HBM3", "--device", other, "--accept",
                "imported") == 0  # fmt: skip
    return out, capsys.readouterr().err


def test_imported_entries_the_devices_launch_would_fail_on_are_skipped_one_line_each(
    server: LiveServer, tmp_path: Path, capsys: Any
) -> None:
    rocm = {**SMALL, "waves_per_eu": 2, "matrix_instr_nonkdim": 16, "kpack": 2}
    huge = {"BLOCK_SIZE_M": 256, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1,
            "num_warps": 8, "num_stages": 4}  # fmt: skip
    folder = tmp_path / "imp"
    folder.mkdir()
    nvidia = "E=8,N=2048,device_name=NVIDIA_H100_80GB_HBM3.json"
    amd = "E=8,N=2048,device_name=AMD_Instinct_MI300X.json"
    (folder / nvidia).write_text(json.dumps({"1": SMALL, "16": rocm, "32": huge}))
    (folder / amd).write_text(json.dumps({"16": rocm}))  # its own platform's fields: kept
    out, err = imported_synced(server.url, folder, capsys, "AMD_Instinct_MI300X")
    assert written(out) == {nvidia: {"1": SMALL}, amd: {"16": rocm}}
    assert f"{nvidia}: entry M=16 skipped: field(s) 'kpack', 'matrix_instr_nonkdim'" in err
    assert f"{nvidia}: entry M=32 skipped: its tiles need" in err
    assert "NVIDIA_H100_80GB_HBM3: wrote 1 file (1 entries: 0 tuned, 1 imported)" in err
    assert "skipped 2 outside the schema" in err


def test_imported_entries_nvidias_triton_refuses_or_spills_are_skipped(
    server: LiveServer, tmp_path: Path, capsys: Any
) -> None:
    """A write token's import of entries in range that NVIDIA's Triton does not compile (a
    ``tl.dot`` K under 16, or under 32 for 8-bit activations, after the engine cuts K to a
    block-quantised file's block) or that hold a 1024 x 1024 accumulator on one warp: each
    skipped, one line, on an NVIDIA GPU; kept for the interpreter, which runs them."""
    thin = {**SMALL, "BLOCK_SIZE_K": 8}
    k16 = {**SMALL, "BLOCK_SIZE_K": 16}
    wide = {"BLOCK_SIZE_M": 1024, "BLOCK_SIZE_N": 1024, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 1,
            "num_warps": 1, "num_stages": 1}  # 64 KiB of tiles: under every shared limit  # fmt: skip
    edge = {**SMALL, "BLOCK_SIZE_M": 256, "BLOCK_SIZE_N": 256, "num_warps": 4, "num_stages": 1}
    names = {device: {dtype: f"E=8,N=2048,device_name={device}{dtype}.json"
                      for dtype in ("", ",dtype=fp8_w8a8", ",dtype=int8_w8a16",
                                    ",block_shape=[128,8]")}
             for device in ("NVIDIA_H100_80GB_HBM3", "intel-xeon-8481c")}  # fmt: skip
    folder = tmp_path / "imp"
    folder.mkdir()
    for by_dtype in names.values():
        for name in by_dtype.values():
            (folder / name).write_text(json.dumps({"1": thin, "2": k16, "4": wide, "8": edge}))
    out, err = imported_synced(server.url, folder, capsys, "intel-xeon-8481c")
    h100 = names["NVIDIA_H100_80GB_HBM3"]
    kept = {"2": k16, "8": edge}
    assert written(out)[h100[""]] == written(out)[h100[",dtype=int8_w8a16"]] == kept
    assert written(out)[h100[",dtype=fp8_w8a8"]] == {"8": edge}  # an 8-bit dot takes K=32
    assert h100[",block_shape=[128,8]"] not in written(out)  # every K cut to 8
    assert (f"{h100['']}: entry M=1 skipped: BLOCK_SIZE_K=8 is under the 16 a 16-bit tl.dot "
            "takes on NVIDIA GPUs") in err  # fmt: skip
    assert f"{h100[',dtype=fp8_w8a8']}: entry M=2 skipped: BLOCK_SIZE_K=16 is under the 32" in err
    assert (f"{h100['']}: entry M=4 skipped: its 1024x1024 tile on 32 threads holds 32768 "
            "accumulators a thread, over the 512 the engine's tuner goes to") in err  # fmt: skip
    interpreted = {"1": thin, "2": k16, "4": wide, "8": edge}
    assert all(written(out)[name] == interpreted for name in names["intel-xeon-8481c"].values())
