"""Triton kernels, spaces and limits: every workload's kernel against its float64 reference.

Without a GPU the kernels run in Triton's CPU interpreter: ``TRITON_INTERPRET=1`` is set while
this module imports Triton (Triton decides then how its own ``tl.sum``, ``tl.cdiv`` run) and, by
an autouse fixture, while its tests run (our kernels jit on first launch). When another module
imported Triton first without the variable, the tests that launch kernels skip and say so. With
a GPU they run on it, from CPU inputs copied over.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from backends.triton.settings import INTERPRET_VAR, interpret_enabled

INTERPRET = not torch.cuda.is_available()
with pytest.MonkeyPatch.context() as _mp:
    if INTERPRET:
        _mp.setenv(INTERPRET_VAR, "1")
    pytest.importorskip("triton")
    import triton.language  # noqa: F401

from backends import Budget, SearchRequest, get_backend  # noqa: E402
from backends.triton import DeviceLimits, TritonBackend  # noqa: E402
from tunecache.errors import InvalidInput  # noqa: E402
from tunecache.space import Config  # noqa: E402
from workloads import get_workload  # noqa: E402
from workloads.triton_kit.jit import LazyKernel, mode_mismatch  # noqa: E402
from workloads.triton_kit.spaces import gemm_shared_memory, next_pow2  # noqa: E402

GEMMS = ("matmul", "bias_gelu")
ROWS = ("softmax", "layernorm", "rmsnorm")
DTYPES = ("float32", "float16", "bfloat16")
# Small shapes, and edge shapes that are multiples of no block size.
SHAPES = {
    "gemm": {"small": {"M": 32, "N": 32, "K": 32}, "edge": {"M": 33, "N": 47, "K": 20}},
    "row": {"small": {"M": 4, "N": 64}, "edge": {"M": 5, "N": 47}},
}


def gemm(m: int, n: int, k: int, group: int, warps: int, stages: int) -> dict[str, int]:
    return {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": group,
            "num_warps": warps, "num_stages": stages}  # fmt: skip


def row(block: int, rows: int, warps: int, stages: int) -> dict[str, int]:
    return {"BLOCK_N": block, "ROWS_PER_PROGRAM": rows, "num_warps": warps, "num_stages": stages}


# Two configs besides the default: GEMMs with several tiles, grouping and a K loop with a ragged
# tail; row kernels that loop over the row, several rows per program (odd M: clamped rows).
EXTRA = {
    "gemm": (gemm(16, 32, 16, 4, 2, 2), gemm(32, 64, 16, 1, 4, 3)),
    "row": (row(16, 2, 1, 2), row(32, 4, 4, 3)),
}
LLM_GEMM = {"M": 4096, "N": 4096, "K": 4096}
LLM_ROW = {"M": 4096, "N": 4096}


@pytest.fixture(autouse=True, scope="module")
def interpreter_without_gpu() -> Iterator[None]:
    """``TRITON_INTERPRET=1`` while this module runs, unless there is a GPU to run on."""
    with pytest.MonkeyPatch.context() as mp:
        if INTERPRET:
            mp.setenv(INTERPRET_VAR, "1")
        yield


@pytest.fixture
def launchable() -> None:
    """Skips when kernels cannot run here: Triton was imported earlier in the wrong mode."""
    if (reason := mode_mismatch()) is not None:
        pytest.skip(reason)


def family(name: str) -> str:
    return "gemm" if name in GEMMS else "row"


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double().cpu() - ref).norm() / ref.norm()).item()


def check(name: str, problem: dict[str, int], dtype: str, config: dict, seed: int = 0) -> float:
    """Runs ``config`` on seeded inputs; asserts dtype, shape, finiteness; returns the error."""
    backend, workload = TritonBackend(), get_workload(name)
    run = backend.build(workload, problem, dtype, config)
    inputs = workload.make_inputs(problem, dtype, seed)
    out = run(*inputs)
    assert out.dtype == inputs[0].dtype
    assert tuple(out.shape) == workload.output_shape(problem)
    assert torch.isfinite(out).all()
    return rel_error(out, workload.reference(*inputs))


# -- correctness ----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["small", "edge"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", GEMMS + ROWS)
@pytest.mark.usefixtures("launchable")
def test_kernel_matches_the_reference(name: str, dtype: str, shape: str) -> None:
    problem = SHAPES[family(name)][shape]
    workload = get_workload(name)
    configs = [workload.default_config("triton", problem, dtype), *EXTRA[family(name)]]
    errors = {str(c): check(name, problem, dtype, c) for c in configs}
    assert max(errors.values()) <= workload.tolerance(dtype), errors


@pytest.mark.slow
@pytest.mark.usefixtures("launchable")
@pytest.mark.parametrize("name", GEMMS + ROWS)
def test_kernel_on_larger_ragged_shapes(name: str) -> None:
    """More tiles, longer loops; the default config and a looped or many-tile one."""
    if family(name) == "gemm":
        problem = {"M": 97, "N": 80, "K": 72}
        looped = gemm(32, 32, 32, 8, 4, 3)
    else:
        problem = {"M": 7, "N": 1000}
        looped = row(128, 2, 2, 3)
    workload = get_workload(name)
    for dtype in ("float32", "bfloat16"):
        default = workload.default_config("triton", problem, dtype)
        errors = [check(name, problem, dtype, default, 1), check(name, problem, dtype, looped, 2)]
        assert max(errors) <= workload.tolerance(dtype), (dtype, errors)


@pytest.mark.usefixtures("launchable")
def test_softmax_survives_large_logits() -> None:
    """Rows whose max is far from zero: without the max subtraction exp() overflows."""
    workload = get_workload("softmax")
    x = torch.linspace(-30.0, 300.0, 5 * 47).reshape(5, 47)
    for config in (workload.default_config("triton", {"M": 5, "N": 47}, "float32"),
                   EXTRA["row"][0]):  # fmt: skip
        out = TritonBackend().build(workload, {"M": 5, "N": 47}, "float32", config)(x)
        assert rel_error(out, workload.reference(x)) <= workload.tolerance("float32")


# -- spaces and pruning ---------------------------------------------------------------------


def test_big_tiles_are_pruned_by_shared_memory_with_a_reason() -> None:
    space = TritonBackend().space(get_workload("matmul"), LLM_GEMM, "float16", DeviceLimits.H100)
    big = Config.of(gemm(256, 256, 256, 8, 8, 5))
    assert gemm_shared_memory(big, "float16") == 5 * (256 * 256 * 2) * 2
    reason = space.prune_reason(big)
    assert reason is not None and "shared memory" in reason and "232448" in reason
    assert 0 < space.pruned_count() < space.size
    tutorial = Config.of(gemm(128, 256, 64, 8, 8, 3))
    assert gemm_shared_memory(tutorial, "float16") == 147456
    assert space.contains(tutorial)
    fp32 = TritonBackend().space(get_workload("matmul"), LLM_GEMM, "float32", DeviceLimits.H100)
    assert "shared memory" in (fp32.prune_reason(tutorial) or "")  # 288 KiB in fp32


def test_configs_over_the_thread_limit_are_pruned() -> None:
    small = DeviceLimits("small GPU", 49152, 128, 8)
    gemms = TritonBackend().space(get_workload("bias_gelu"), LLM_GEMM, "float16", small)
    config = Config.of(gemm(64, 64, 32, 8, 8, 2))
    assert "256 threads per block exceed small GPU's 128" in (gemms.prune_reason(config) or "")
    assert gemms.contains(config.replace(num_warps=4))
    rows = TritonBackend().space(get_workload("softmax"), LLM_ROW, "float16", DeviceLimits.H100)
    over = Config.of(row(4096, 1, 16, 1))
    assert rows.contains(over)  # 512 threads: fine on an H100
    tiny = DeviceLimits("tiny GPU", 49152, 256, 8)
    rows = TritonBackend().space(get_workload("softmax"), LLM_ROW, "float16", tiny)
    assert "512 threads per block exceed tiny GPU's 256" in (rows.prune_reason(over) or "")


def test_tiles_far_larger_than_the_problem_are_pruned() -> None:
    space = TritonBackend().space(get_workload("matmul"), SHAPES["gemm"]["edge"], "float16")
    config = Config.of(gemm(128, 128, 64, 1, 4, 2))
    assert space.contains(config)  # M=33 → 64; one power of two above is allowed
    assert "BLOCK_M=256 is far larger than M=33" in (
        space.prune_reason(config.replace(BLOCK_M=256)) or ""
    )
    assert "BLOCK_K=128" in (space.prune_reason(config.replace(BLOCK_K=128)) or "")
    assert space.pruned_count() > 0


def test_row_spaces_loop_or_cover_the_row() -> None:
    space = TritonBackend().space(get_workload("layernorm"), {"M": 5, "N": 47}, "float32")
    loop = Config.of(row(16, 1, 1, 3))
    assert space.contains(loop)
    assert "larger than the row" in (space.prune_reason(loop.replace(BLOCK_N=128)) or "")
    assert "num_stages must be 1" in (space.prune_reason(loop.replace(BLOCK_N=64)) or "")
    assert space.contains(loop.replace(BLOCK_N=64, num_stages=1))
    assert "warps" in (space.prune_reason(loop.replace(num_warps=4)) or "")  # 16 elements
    assert space.contains(loop.replace(ROWS_PER_PROGRAM=4))  # M=5: 4 rows per program is fine
    one_row = TritonBackend().space(get_workload("rmsnorm"), {"M": 1, "N": 16}, "float32")
    assert "rows there are" in (one_row.prune_reason(loop.replace(ROWS_PER_PROGRAM=2)) or "")
    huge = TritonBackend().space(get_workload("softmax"), {"M": 8, "N": 65536}, "float32")
    spill = Config.of(row(65536, 1, 1, 1))
    assert "spill" in (huge.prune_reason(spill) or "")


@pytest.mark.parametrize(
    "limits", [DeviceLimits.H100, DeviceLimits.A100, DeviceLimits.CPU_INTERPRETER]
)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", GEMMS + ROWS)
def test_the_default_config_is_in_the_space(name: str, dtype: str, limits: DeviceLimits) -> None:
    workload, backend = get_workload(name), TritonBackend()
    module = workload.backend_module("triton")
    if family(name) == "gemm":
        more = [LLM_GEMM, {"M": 1, "N": 1, "K": 1}, {"M": 8, "N": 50000, "K": 96}]
    else:
        more = [LLM_ROW, {"M": 1, "N": 1}, {"M": 3, "N": 100000}]
    problems = [*SHAPES[family(name)].values(), *more]
    for problem in problems:
        config = module.default_config(problem, dtype, limits)
        space = backend.space(workload, problem, dtype, limits)
        assert space.prune_reason(config) is None, (problem, config)


def test_tutorial_defaults_at_llm_sizes() -> None:
    matmul, softmax = get_workload("matmul"), get_workload("softmax")
    assert matmul.default_config("triton", LLM_GEMM, "float16") == {
        "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1,
        "num_stages": 3, "num_warps": 8}  # fmt: skip
    assert softmax.default_config("triton", LLM_ROW, "float16") == {
        "BLOCK_N": 4096, "ROWS_PER_PROGRAM": 1, "num_stages": 1, "num_warps": 8}  # fmt: skip
    # Backward compatible: no problem means the demo problem, and other backends are unchanged.
    assert matmul.default_config("triton") == matmul.default_config(
        "triton", matmul.demo_problem, "float32"
    )
    assert matmul.default_config("tvm") == {"schedule": "default"}


# -- limits, settings, backend --------------------------------------------------------------


def test_device_limits_from_cuda_properties() -> None:
    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", multi_processor_count=132,
                            shared_memory_per_block=49152, shared_memory_per_block_optin=232448,
                            max_threads_per_block=1024, warp_size=32)  # fmt: skip
    limits = DeviceLimits.from_properties(props)
    assert limits == DeviceLimits("NVIDIA H100 80GB HBM3", 232448, 1024, 132, 32)
    assert limits.max_shared_memory_per_block == DeviceLimits.H100.max_shared_memory_per_block
    # An older torch without the opt-in attribute or the thread limit: fall back.
    old = SimpleNamespace(name="old", multi_processor_count=80, shared_memory_per_block=49152)
    assert DeviceLimits.from_properties(old) == DeviceLimits("old", 49152, 1024, 80, 32)
    with pytest.raises(ValueError, match="sm_count"):
        DeviceLimits("broken", 49152, 1024, 0)


def test_interpret_setting_is_parsed_in_one_place() -> None:
    assert interpret_enabled({INTERPRET_VAR: "1"}) and interpret_enabled({INTERPRET_VAR: "True"})
    assert not interpret_enabled({}) and not interpret_enabled({INTERPRET_VAR: "0"})
    with pytest.raises(ValueError, match=INTERPRET_VAR):
        interpret_enabled({INTERPRET_VAR: "maybe"})


@pytest.mark.usefixtures("launchable")
def test_backend_contract() -> None:
    backend = get_backend("triton")
    assert isinstance(backend, TritonBackend)
    assert backend.unavailable_reason() is None  # a GPU, or the fixture's interpreter
    matmul = get_workload("matmul")
    problem = SHAPES["gemm"]["edge"]
    assert backend.summarize(matmul.default_config("triton", problem, "float16")) == (
        "128x128x32 g8 w4 s4"
    )
    assert backend.summarize(EXTRA["row"][0]) == "block 16 r2 w1 s2"
    with pytest.raises(InvalidInput, match="far larger"):
        backend.build(matmul, problem, "float16", {**EXTRA["gemm"][0], "BLOCK_M": 256})
    with pytest.raises(InvalidInput, match="parameters"):
        backend.build(matmul, problem, "float16", {"BLOCK_M": 16})
    with pytest.raises(InvalidInput, match="supports dtypes"):
        backend.space(matmul, problem, "float64")
    with pytest.raises(NotImplementedError, match="tuner"):
        backend.search(SearchRequest(matmul, problem, "float16", Budget()), workdir=Path("."))


@pytest.mark.usefixtures("launchable")
def test_kernels_jit_on_first_launch_in_the_current_mode() -> None:
    kernel = get_workload("rmsnorm").backend_module("triton").rmsnorm_kernel
    assert isinstance(kernel, LazyKernel)
    jitted = kernel.jit()
    assert kernel.jit() is jitted
    if interpret_enabled():
        assert type(jitted).__name__ == "InterpretedFunction"


def test_next_pow2() -> None:
    assert [next_pow2(n) for n in (1, 2, 3, 16, 17, 4096)] == [1, 2, 4, 16, 32, 4096]


# -- the rmsnorm workload on the other backends ---------------------------------------------


def test_rmsnorm_torch_fn_matches_the_reference() -> None:
    workload = get_workload("rmsnorm")
    problem = workload.problem({"M": 5, "N": 47})
    inputs = workload.make_inputs(problem, "float32", seed=4)
    assert [tuple(t.shape) for t in inputs] == [(5, 47), (47,)]
    out, ref = workload.torch_fn(*inputs), workload.reference(*inputs)
    assert ref.dtype == torch.float64 and tuple(out.shape) == workload.output_shape(problem)
    assert rel_error(out, ref) <= workload.tolerance("float32")
    assert workload.flops(problem) == 4 * 5 * 47


@pytest.mark.slow
def test_rmsnorm_tvm_compute_matches_the_reference() -> None:
    pytest.importorskip("tvm")
    workload, problem = get_workload("rmsnorm"), {"M": 5, "N": 47}
    run = get_backend("tvm").build(workload, problem, "float32", workload.default_config("tvm"))
    inputs = workload.make_inputs(problem, "float32", seed=5)
    assert rel_error(run(*inputs), workload.reference(*inputs)) <= workload.tolerance("float32")
