"""Split-K in the GEMM kernel (``matmul``, ``bias_gelu``): correct at every ``SPLIT_K`` on
ragged shapes, independent of ``SPLIT_K`` beyond rounding, deterministic, offered only where it
can help (with the reasons as sentences), and backward compatible with records tuned before it.

Kernels run in Triton's CPU interpreter here (``tests/test_triton_kernels.py`` chooses the mode);
one test compiles both split-K kernels for ``sm_90`` in a process without the interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from backends.triton import DeviceLimits, TritonBackend
from tests.test_triton_kernels import INTERPRET, interpreter_without_gpu, launchable  # noqa: F401
from tunecache.errors import InvalidInput
from tunecache.space import Config, SearchSpace
from tuner.validation import check, validate
from workloads import get_workload
from workloads.triton_kit.spaces import gemm_default, gemm_space

SPLITS = (1, 2, 4, 8, 16)
# Ragged: M and N multiples of no tile, K=300 a multiple of no SPLIT_K x BLOCK_K.
EDGE = {"M": 33, "N": 47, "K": 300}
H100 = DeviceLimits.H100


def config(split: int, block_k: int = 16) -> dict[str, int]:
    return {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": block_k, "GROUP_M": 4, "SPLIT_K": split,
            "num_warps": 2, "num_stages": 2}  # fmt: skip


def big_tile(m: int, n: int, k: int, *, split: int, stages: int) -> Config:
    """A tile of ``m`` x ``n`` (``k`` deep) at 8 warps: the configs of large GEMMs."""
    return Config.of({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8, "SPLIT_K": split,
                      "num_warps": 8, "num_stages": stages})  # fmt: skip


@pytest.mark.usefixtures("launchable")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", ["matmul", "bias_gelu"])
def test_every_split_is_correct_on_ragged_shapes_with_poisoned_outputs(
    name: str, dtype: str
) -> None:
    workload, backend = get_workload(name), TritonBackend()
    results = {}
    for split in SPLITS:
        run = backend.build(workload, EDGE, dtype, config(split))
        results[split] = check(run, workload, EDGE, dtype, seed=split, device="cpu")
    failed = {s: (r.rel_error, r.note) for s, r in results.items() if not r.passed}
    assert not failed, failed


@pytest.mark.usefixtures("launchable")
@pytest.mark.parametrize("name", ["matmul", "bias_gelu"])
def test_the_result_does_not_depend_on_split_k_beyond_rounding(name: str) -> None:
    workload, backend = get_workload(name), TritonBackend()
    inputs = workload.make_inputs(EDGE, "float32", seed=4)
    outs = {s: backend.build(workload, EDGE, "float32", config(s))(*inputs) for s in SPLITS}
    for split, out in outs.items():
        gap = ((out.double() - outs[1].double()).norm() / outs[1].double().norm()).item()
        assert gap < 1e-6, (split, gap)  # fp32 sums in another order; not a wrong element
    again = backend.build(workload, EDGE, "float32", config(8))(*inputs)
    assert torch.equal(again, outs[8])  # partial sums added in a fixed order: deterministic


def test_decode_shapes_are_offered_split_k() -> None:
    space = gemm_space({"M": 16, "N": 6144, "K": 4096}, "bfloat16", H100)
    splits = {int(c["SPLIT_K"]) for c in space.configs()}
    assert splits == set(SPLITS)
    # the best tile of the brute force (96 tiles for 132 SMs) may now split K
    assert space.contains(Config.of({**config(2, 128), "BLOCK_N": 64}))


def test_a_grid_that_already_fills_the_gpu_is_not_split() -> None:
    space = gemm_space({"M": 4096, "N": 4096, "K": 4096}, "bfloat16", H100)
    reason = space.prune_reason(big_tile(128, 256, 64, split=2, stages=3))
    assert reason is not None and "512 output tiles of 128x256 already fill" in reason
    assert "3.9 times over" in reason


def test_slices_shorter_than_block_k_are_pruned() -> None:
    space = gemm_space({"M": 16, "N": 256, "K": 256}, "bfloat16", H100)
    reason = space.prune_reason(Config.of(config(16, 64)))
    assert reason == "SPLIT_K=16 cuts K=256 into slices of 16, shorter than BLOCK_K=64"


def test_splitting_into_more_programs_than_a_few_waves_is_pruned() -> None:
    space = gemm_space({"M": 16, "N": 6144, "K": 4096}, "bfloat16", H100)
    reason = space.prune_reason(Config.of({**config(8, 128), "BLOCK_N": 64}))
    assert reason == ("SPLIT_K=8 makes 768 programs of 96 tiles, over 4 waves of H100 (preset)'s 132 "
                      "SMs: a smaller split fills them")  # fmt: skip
    assert space.contains(Config.of({**config(4, 128), "BLOCK_N": 64}))


def test_a_workspace_over_the_bound_is_pruned() -> None:
    space = gemm_space({"M": 1024, "N": 16384, "K": 8192}, "bfloat16", H100)
    reason = space.prune_reason(big_tile(256, 256, 32, split=2, stages=2))
    assert reason is not None and "needs 128 MiB of fp32 partial sums" in reason


def test_large_shapes_keep_their_size_and_the_default_does_not_split() -> None:
    problem = {"M": 8192, "N": 8192, "K": 8192}
    space = gemm_space(problem, "bfloat16", H100)
    assert any(int(c["SPLIT_K"]) == 1 for c in space.configs())
    assert gemm_default(problem, "bfloat16", H100)["SPLIT_K"] == 1
    assert gemm_default({"M": 16, "N": 6144, "K": 4096}, "bfloat16", H100)["SPLIT_K"] == 1


@pytest.mark.usefixtures("launchable")
def test_a_record_tuned_before_split_k_still_validates_and_launches() -> None:
    """A config without ``SPLIT_K`` (every record stored before it existed) means SPLIT_K=1."""
    old = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 4, "num_warps": 2,
           "num_stages": 2}  # fmt: skip
    workload, backend = get_workload("bias_gelu"), TritonBackend()
    space = backend.space(workload, EDGE, "float16")
    assert space.contains(Config.of(old))
    assert space.complete(Config.of(old))["SPLIT_K"] == 1
    report = validate(lambda p: backend.build(workload, p, "float16", old), workload, EDGE,
                      "float16", seeds=(1, 2))  # fmt: skip
    assert report.passed, report.checks


def test_a_space_refuses_a_default_outside_its_choices() -> None:
    with pytest.raises(InvalidInput, match="default SPLIT_K=3"):
        SearchSpace({"SPLIT_K": (1, 2)}, defaults={"SPLIT_K": 3})


def test_the_split_k_kernels_compile_for_sm_90_without_a_gpu() -> None:
    """Both launches of a split-K GEMM compile for Hopper (Triton's compiler, no interpreter)."""
    script = textwrap.dedent("""
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        import workloads.matmul.triton as mt

        def build(kernel, types, constants, **options):
            fn = kernel.jit()
            signature = {n: types.get(n, "i32") for n in fn.arg_names}
            signature.update({n: "constexpr" for n in constants})
            where = {(fn.arg_names.index(n),): v for n, v in constants.items()}
            return triton.compile(ASTSource(fn, signature, where),
                                  target=GPUTarget("cuda", 90, 32), options=options)

        gemm = build(mt.matmul_kernel,
                     {"a_ptr": "*bf16", "b_ptr": "*bf16", "bias_ptr": "*bf16", "c_ptr": "*bf16",
                      "ws_ptr": "*fp32"},
                     dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, SPLIT_K=8,
                          DOT_PRECISION="tf32", DOT_IN_FP32=False, EPILOGUE="bias_gelu"),
                     num_warps=4, num_stages=3)
        reduce = build(mt.split_k_reduce_kernel,
                       {"ws_ptr": "*fp32", "bias_ptr": "*bf16", "c_ptr": "*bf16"},
                       dict(SPLIT_K=8, BLOCK=1024, EPILOGUE="bias_gelu"), num_warps=4)
        print(gemm.metadata.shared, len(gemm.asm["cubin"]), len(reduce.asm["cubin"]))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=300, cwd=Path(__file__).parents[1])  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    shared, gemm_bytes, reduce_bytes = map(int, done.stdout.split())
    assert 0 < shared <= H100.max_shared_memory_per_block
    assert gemm_bytes > 0 and reduce_bytes > 0
