"""On a CUDA GPU: every Triton kernel against its float64 reference, and the CUDA timer against
the profiler's kernel durations. Marked ``gpu``; every test skips without a GPU.

Correctness runs through the pipeline's own check (:func:`tuner.validation.check`): fresh seeded
random inputs, the output buffer filled with NaN first (an element never written fails), the
float64 reference, the workload's tolerance for the dtype. Each kernel runs in fp32, fp16 and bf16
on an edge shape (no size a multiple of a tile) with its default config, two small-tile configs
and the largest-tile config its space keeps there.
"""

from __future__ import annotations

import pytest
import torch

from tests.test_triton_kernels import EXTRA, GEMMS, ROWS, family

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = ("float32", "float16", "bfloat16")
# Edge shapes large enough for the big tiles the GPU spaces keep, multiples of no tile.
EDGE = {"gemm": {"M": 257, "N": 383, "K": 191}, "row": {"M": 67, "N": 4097}}


def _configs(name: str, problem: dict[str, int], dtype: str) -> list[dict]:
    from backends.triton import TritonBackend
    from workloads import get_workload

    workload = get_workload(name)
    space = TritonBackend().space(workload, problem, dtype)

    def tiles(config: object) -> tuple[int, int]:
        c = config.to_json()  # type: ignore[attr-defined]
        blocks = [v for k, v in c.items() if k.startswith("BLOCK") or k == "ROWS_PER_PROGRAM"]
        return int(torch.tensor(blocks).prod()), c["num_warps"]

    biggest = max(space.configs(), key=tiles)
    return [workload.default_config("triton", problem, dtype), *EXTRA[family(name)],
            biggest.to_json()]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", GEMMS + ROWS)
def test_every_kernel_is_correct_on_edge_shapes_with_poisoned_outputs(
    name: str, dtype: str
) -> None:
    from backends.triton import TritonBackend
    from tuner.validation import check
    from workloads import get_workload

    workload, backend = get_workload(name), TritonBackend()
    problem = EDGE[family(name)]
    failures = {}
    for seed, config in enumerate(_configs(name, problem, dtype), start=11):
        run = backend.build(workload, problem, dtype, config)
        result = check(run, workload, problem, dtype, seed, device="cuda")
        if not result.passed:
            failures[str(config)] = (result.rel_error, result.note)
    assert not failures, failures


def _timer_cases() -> list[tuple[str, dict[str, int], str]]:
    return [
        ("matmul", {"M": 4096, "N": 4096, "K": 4096}, "bfloat16"),
        ("matmul", {"M": 16, "N": 6144, "K": 4096}, "bfloat16"),
        ("softmax", {"M": 4096, "N": 4096}, "float16"),
        ("rmsnorm", {"M": 8192, "N": 4096}, "bfloat16"),
    ]


@pytest.mark.parametrize(("name", "problem", "dtype"), _timer_cases())
def test_the_cuda_timer_reports_the_devices_time(name: str, problem: dict, dtype: str) -> None:
    """The median of :func:`tunecache.timing.time_cuda` within 5 % (and 2 µs) of the kernels'
    own durations from the profiler, L2 flushed in both, also where the launch path takes
    longer than the kernel (the decode GEMM at M=16: about 20 µs on the device against 30 µs
    and more of host work per launch); each timed twice, and the closer pair counts. Triton's
    ``do_bench`` agrees where the host keeps ahead (not asserted: that is the launch path's
    business, measured in bench/gpu/launch_gap.py)."""
    import torch

    from backends.triton import TritonBackend
    from bench.gpu.common import profiled_device_us
    from tunecache.timing import L2_FLUSH_BYTES, TimerSettings, time_cuda
    from workloads import get_workload

    workload = get_workload(name)
    run = TritonBackend().build(workload, problem, dtype, workload.default_config(
        "triton", problem, dtype))  # fmt: skip
    inputs = [t.cuda() for t in workload.make_inputs(problem, dtype, seed=5)]
    settings = TimerSettings(warmup=10, min_repeats=50, max_repeats=1000, target_s=0.5)
    ours = [time_cuda(lambda: run(*inputs), settings).median_ms * 1e3 for _ in range(2)]
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    device = [profiled_device_us(lambda: run(*inputs), flush) for _ in range(2)]
    gap = min(abs(a - b) - 0.05 * b for a in ours for b in device)
    assert gap <= 2.0, (ours, device)


def test_the_drop_ins_check_runs_on_the_device_and_agrees_with_the_host() -> None:
    """``verify="first"`` and the drop-in's validation make their copies and compare them on the
    GPU (on the host, a 4096×14336 GEMM's check took seconds: bench/results/h200-2026-11-27)."""
    from tunecache.closeness import CHUNK
    from tunecache.triton.check import SEED, compare_outputs, fresh_call

    a = torch.empty(CHUNK + 77, device="cuda", dtype=torch.bfloat16)
    (got,), _ = fresh_call((a,), {}, SEED)
    (want,), _ = fresh_call((a,), {}, SEED)
    assert got.device == a.device and got.dtype == a.dtype and torch.equal(got, want)
    got[-1] += 1.0
    on_device = compare_outputs([got], [want], 1e-4, {"n": 1})
    on_host = compare_outputs([got.cpu()], [want.cpu()], 1e-4, {"n": 1})
    assert on_device.rel_error == pytest.approx(on_host.rel_error, rel=1e-9)
    assert on_device.max_abs_error == on_host.max_abs_error and not on_device.passed
