"""The GPU campaign's scripts (``bench/gpu``) on a CPU: their dry runs, their refusals, and the
merge of results into one table. The runs themselves need a GPU (``bash bench/gpu/run.sh``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.gpu import decode_gemm, kernels, merge, startup
from bench.gpu import tuning_throughput as gpu_throughput
from bench.gpu.common import ceilings_from

NO_GPU = not torch.cuda.is_available()


def test_the_gemm_dry_run_plans_every_llama_projection_at_every_m(capsys) -> None:
    assert kernels.main(["gemm", "--dry-run", "--dtypes", "bfloat16", "--ms", "16,2048"]) == 0
    out = capsys.readouterr().out
    assert "8 keys" in out
    for label in ("qkv M=16", "gate_up M=2048", "down M=16"):
        assert label in out
    assert "{'M': 16, 'N': 28672, 'K': 4096}" in out  # gate-up: N=2*14336
    sizes = {line.split()[2]: int(line.split()[-1]) for line in out.splitlines() if "space" in line}
    assert sizes["M=16"] > 1158  # the 1,158 configs measured on the H100, and split-K's


def test_the_rows_dry_run_plans_the_memory_bound_keys(capsys) -> None:
    assert kernels.main(["rows", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert {"softmax", "layernorm", "rmsnorm", "bias_gelu"} <= set(out.split())


@pytest.mark.parametrize(("argv", "complaint"), [
    (["gemm", "--dry-run", "--dtypes", "float8"], "--dtypes: 'float8'"),
    (["gemm", "--dry-run", "--ms", "16,x"], "--ms: '16,x'"),
    (["tiles"], "invalid choice"),
])  # fmt: skip
def test_bad_arguments_exit_2_naming_them(argv: list[str], complaint: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        kernels.main(argv)
    assert exit_.value.code == 2
    assert complaint in capsys.readouterr().err


@pytest.mark.skipif(not NO_GPU, reason="checks the refusal without a GPU")
@pytest.mark.parametrize("module", ["bench.gpu.kernels gemm", "bench.gpu.ceilings",
                                    "bench.gpu.startup", "bench.gpu.decode_gemm",
                                    "bench.gpu.tuning_throughput"])  # fmt: skip
def test_without_a_gpu_the_runs_refuse_with_exit_2(module: str) -> None:
    done = subprocess.run([sys.executable, "-m", *module.split()], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[1])  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "no CUDA GPU" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_startup_dry_run_lists_fifty_shapes_and_the_four_processes(capsys) -> None:
    assert startup.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("50 shapes")
    assert "processes, in order: pretune, cached, verified, plain" in out
    assert len(set(startup.SHAPES)) == 50


def test_ceilings_are_taken_from_a_file_only_when_measured_on_the_same_gpu(tmp_path: Path) -> None:
    # 2026-12-04: an H200's decode table took the committed file's H100 copy bandwidth as its own.
    path = tmp_path / "ceilings.json"
    path.write_text(json.dumps({"copy_tbs": 3.0, "mm_tflops": 679.0,
                                "device": "NVIDIA H100 80GB HBM3"}))  # fmt: skip
    assert ceilings_from(path, "NVIDIA H200") is None
    same = ceilings_from(path, "NVIDIA H100 80GB HBM3")
    assert same is not None and same.copy_tbs == 3.0 and "from ceilings.json" in same.source
    path.write_text(json.dumps({"copy_tbs": 3.0, "mm_tflops": 679.0}))  # written before names
    assert ceilings_from(path, "NVIDIA H100 80GB HBM3") is None
    assert ceilings_from(tmp_path / "missing.json", "NVIDIA H200") is None
    committed = json.loads((Path(__file__).parents[1] / "bench/results/ceilings-gpu.json")
                           .read_text())  # fmt: skip
    assert committed["device"] == "NVIDIA H100 80GB HBM3"  # what run.sh passes by default


def _row(label: str, dtype: str, tuned: float, torch_ms: float, default: float, **extra) -> dict:
    return {"kernel": "matmul", "label": label, "problem": {"M": 16, "N": 64, "K": 64},
            "dtype": dtype, "record_device": "sm_90 / h100-80gb-hbm3", "space": 10, "trials": 4,
            "tune_s": 2.0, "validation_error": 1e-3, "config": "16x64x64 g1 w4 s3",
            "tuned_ms": tuned, "torch_ms": torch_ms, "default_ms": default,
            "flops": 2 * 16 * 64 * 64 * 10**6, "bytes": 10**6, **extra}  # fmt: skip


def test_merge_takes_each_key_from_the_last_run_and_states_the_geomeans(tmp_path: Path) -> None:
    ceilings = tmp_path / "c.json"
    ceilings.write_text(json.dumps({"copy_tbs": 3.0, "mm_tflops": 700.0}))
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps([_row("qkv M=16", "bfloat16", 2.0, 1.0, 2.0),
                                 _row("o M=16", "bfloat16", 1.0, 1.0, 4.0)]))  # fmt: skip
    second.write_text(json.dumps([_row("qkv M=16", "bfloat16", 1.0, 1.0, 1.0,
                                       inductor_ms=2.0)]))  # fmt: skip
    out = tmp_path / "k.md"
    assert merge.main([str(out), "--ceilings", str(ceilings), "--gemm", str(first),
                       str(second)]) == 0  # fmt: skip
    text = out.read_text()
    assert "geomean tuned/cuBLAS 1.000, tuned/default 2.000" in text  # (1/1 · 4/1) ** 0.5
    assert "tuned/Inductor 2.000 (over the 1 keys timed with Inductor)" in text
    assert text.count("| bfloat16 |") == 2  # the re-run replaced the first qkv row


def test_the_decode_dry_run_plans_twenty_keys_with_and_without_split_k(capsys) -> None:
    assert decode_gemm.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "20 keys, each tuned twice" in out
    line = next(x for x in out.splitlines() if x.startswith("qkv M=16 "))
    full, cut = (int(w) for w in line.replace(")", "").split() if w.isdigit())
    assert cut == 1158 < full  # the space measured on the H100, and what split-K adds


@pytest.mark.parametrize(("argv", "complaint"), [
    (["--dry-run", "--ms", "0,16"], "sizes must be at least 1"),
    (["--dry-run", "--projections", "qkv,lm_head"], "--projections: lm_head not among"),
])  # fmt: skip
def test_the_decode_bench_names_a_bad_argument(argv: list[str], complaint: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        decode_gemm.main(argv)
    assert exit_.value.code == 2
    assert complaint in capsys.readouterr().err


def test_the_search_without_split_k_is_the_same_space_cut_to_split_k_1() -> None:
    from backends.triton import TritonBackend
    from workloads import get_workload

    problem, workload = {"M": 16, "N": 6144, "K": 4096}, get_workload("matmul")
    full = TritonBackend().space(workload, problem, "bfloat16")
    cut = decode_gemm.NoSplitK().space(workload, problem, "bfloat16")
    assert {int(c["SPLIT_K"]) for c in cut.configs()} == {1}
    assert set(cut.configs()) == {c for c in full.configs() if c["SPLIT_K"] == 1}
    assert decode_gemm.NoSplitK().name == "triton"  # keyed as the Triton backend


def test_the_tuning_throughput_bench_runs_each_measure_small() -> None:
    """Each figure of ``bench.tuning_throughput`` comes out (their sizes are the bench's)."""
    from bench import tuning_throughput as bench

    configs = bench.gemm_configs(2)
    assert len(configs) == 3 and all("SPLIT_K" in c for c in configs)
    rate, each = bench.compile_throughput(configs, workers=1)  # real compiles for sm_90
    assert rate > 0 and each > 0
    farm = bench.farm_throughput(configs, workers=1)  # through the compile farm
    assert all(farm[k] > 0 for k in ("rate", "start", "first", "next")), farm
    for farm in (False, True):
        overhead, timed = bench.harness_overhead(candidates=6, workers=2, farm=farm)
        assert overhead > 0 and timed >= 0
    assert bench.first_result("bench.tuning_throughput:Trivial", "softmax", {"M": 8, "N": 64},
                              warm=True) > 0  # fmt: skip


def test_the_gpu_throughput_dry_run_finds_the_h100_landscape_optimum(capsys) -> None:
    assert gpu_throughput.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "qkv M=16    space" in out and "landscape optimum 0.02781 ms" in out
    assert "3 keys x 200 trials" in out and "compiled in the compile farm" in out
    assert gpu_throughput.main(["--dry-run", "--no-farm", "--workers", "4"]) == 0
    assert "4 workers, compiled each in its timing worker" in capsys.readouterr().out


def test_the_launch_gap_dry_run_plans_the_three_configs(capsys) -> None:
    from bench.gpu import launch_gap

    assert launch_gap.main(["--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and sum("split-K 4" in line for line in lines) == 1


def test_the_launch_arguments_of_a_config_are_worked_out_once() -> None:
    """The host work a decode GEMM cannot hide (bench/results/h200-2026-11-26): a config's
    launch arguments come from a cache after its first call, and equal configs share them."""
    import torch

    from tunecache.space import Config
    from workloads.matmul.triton import launch_meta

    config = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "GROUP_M": 4, "num_warps": 2,
              "num_stages": 5, "SPLIT_K": 4}  # fmt: skip
    first = launch_meta(Config.of(config), torch.bfloat16, "none", False)
    again = launch_meta(Config.of(dict(reversed(config.items()))), torch.bfloat16, "none", False)
    assert again is first and (first.block_m, first.block_n, first.split_k) == (16, 64, 4)
    assert first.kwargs["DOT_PRECISION"] == "tf32" and first.kwargs["num_stages"] == 5
    fp32 = launch_meta(Config.of(config), torch.float32, "none", False)
    assert fp32.kwargs["DOT_PRECISION"] == "tf32x3" and fp32 is not first
