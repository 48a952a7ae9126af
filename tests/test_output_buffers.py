"""``out=`` buffers: every kernel writes its result into the caller's buffer, in place.

Validation fills ``out`` with NaN before a launch, so an element a kernel never writes shows. Each
Triton workload's ``launch(config, *inputs, out=...)`` and the TVM runnable must return ``out``
itself, leave no NaN in it, agree with the call without ``out``, and reject a buffer of the wrong
shape, dtype or device with ValueError.

Without a GPU the Triton kernels run in Triton's CPU interpreter, chosen by
``tests/test_triton_kernels.py`` (imported first, with its fixtures); with a GPU they run on it.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

# Triton's interpreter must be chosen before the first `import triton`: importing the Triton kernel
# tests chooses it as they do, and lends this module their fixtures (TRITON_INTERPRET=1 while it
# runs without a GPU; `launchable` skips when Triton was imported here in the other mode).
from tests.test_triton_kernels import (  # noqa: F401
    EXTRA,
    GEMMS,
    INTERPRET,
    ROWS,
    SHAPES,
    family,
    interpreter_without_gpu,
    launchable,
)
from tunecache.space import Config
from workloads import get_workload
from workloads.base import Workload

DEVICE = "cpu" if INTERPRET else "cuda"
NAMES = GEMMS + ROWS


def edge_problem(name: str) -> dict[str, int]:
    """Odd sizes, multiples of no block: edge tiles and clamped rows must still be written."""
    return SHAPES[family(name)]["edge"]


def nan_like(workload: Workload, problem: dict[str, int], like: torch.Tensor) -> torch.Tensor:
    """An output buffer for ``problem`` full of NaN: what the kernel leaves unwritten shows."""
    shape = workload.output_shape(problem)
    return torch.full(shape, float("nan"), dtype=like.dtype, device=like.device)


def assert_written_in_place(
    run: Any, workload: Workload, problem: dict[str, int], inputs: Any
) -> None:
    """``run(*inputs, out=...)`` returns the buffer, fully written, equal to ``run(*inputs)``."""
    fresh = run(*inputs)
    out = nan_like(workload, problem, inputs[0])
    returned = run(*inputs, out=out)
    assert returned is out
    unwritten = torch.isnan(out)
    assert not unwritten.any(), f"{int(unwritten.sum())} elements never written"
    torch.testing.assert_close(out, fresh, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.usefixtures("launchable")
def test_triton_kernels_write_into_out(name: str, dtype: str) -> None:
    """The default config, and others with several tiles, K or row loops, rows per program."""
    workload, problem = get_workload(name), edge_problem(name)
    launch = workload.backend_module("triton").launch
    inputs = tuple(t.to(DEVICE) for t in workload.make_inputs(problem, dtype, seed=3))
    for config in (workload.default_config("triton", problem, dtype), *EXTRA[family(name)]):
        run = functools.partial(launch, Config.of(config))
        assert_written_in_place(run, workload, problem, inputs)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.usefixtures("launchable")
def test_triton_kernels_reject_a_wrong_out(name: str) -> None:
    workload, problem = get_workload(name), edge_problem(name)
    launch = workload.backend_module("triton").launch
    config = Config.of(workload.default_config("triton", problem, "float32"))
    inputs = tuple(t.to(DEVICE) for t in workload.make_inputs(problem, "float32", seed=3))
    m, n = workload.output_shape(problem)
    with pytest.raises(ValueError, match="shape"):
        launch(config, *inputs, out=torch.empty((m, n + 1), device=DEVICE))
    with pytest.raises(ValueError, match="dtype"):
        launch(config, *inputs, out=torch.empty((m, n), dtype=torch.float16, device=DEVICE))
    with pytest.raises(ValueError, match="contiguous"):
        launch(config, *inputs, out=torch.empty((n, m), device=DEVICE).t())
    with pytest.raises(ValueError, match="device"):
        launch(config, *inputs, out=torch.empty((m, n), device="meta"))


@pytest.fixture(scope="module")
def tvm_backend() -> Any:
    pytest.importorskip("tvm")
    from backends.tvm import TVMBackend

    return TVMBackend()


@pytest.mark.parametrize("name", NAMES)
def test_tvm_runnable_writes_into_out(tvm_backend: Any, name: str) -> None:
    workload, problem = get_workload(name), edge_problem(name)
    run = tvm_backend.build(workload, problem, "float32", {"schedule": "default"})
    inputs = workload.make_inputs(problem, "float32", seed=3)
    assert_written_in_place(run, workload, problem, inputs)
    error = (run(*inputs).double() - workload.reference(*inputs)).norm()
    assert error / workload.reference(*inputs).norm() <= workload.tolerance("float32")
    m, n = workload.output_shape(problem)
    with pytest.raises(ValueError, match=r"shape \(5, 5\), not"):
        run(*inputs, out=torch.empty((5, 5)))
    with pytest.raises(ValueError, match="dtype"):
        run(*inputs, out=torch.empty((m, n), dtype=torch.float64))
    with pytest.raises(ValueError, match="contiguous"):
        run(*inputs, out=torch.empty((n, m)).t())
    with pytest.raises(ValueError, match="device"):
        run(*inputs, out=torch.empty((m, n), device="meta"))
