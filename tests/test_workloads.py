"""Workloads: problems, seeded non-zero inputs, the float64 reference, costs, keys."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tunecache import key_for
from tunecache.errors import InvalidInput
from workloads import WORKLOADS, get_workload

SMALL = {"matmul": {"M": 8, "N": 16, "K": 12}, "softmax": {"M": 4, "N": 33},
         "layernorm": {"M": 4, "N": 33}, "rmsnorm": {"M": 4, "N": 33},
         "bias_gelu": {"M": 8, "N": 16, "K": 12}}  # fmt: skip


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_torch_fn_matches_the_reference(name: str) -> None:
    w = get_workload(name)
    problem = w.problem(SMALL[name])
    inputs = w.make_inputs(problem, "float32", seed=3)
    out, ref = w.torch_fn(*inputs), w.reference(*inputs)
    assert ref.dtype == torch.float64
    assert tuple(out.shape) == w.output_shape(problem) == tuple(ref.shape)
    assert rel_error(out, ref) < w.tolerance("float32")


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_inputs_are_seeded_nonzero_and_vary(name: str) -> None:
    w = get_workload(name)
    a = w.make_inputs(SMALL[name], "float32", seed=1)
    b = w.make_inputs(SMALL[name], "float32", seed=1)
    c = w.make_inputs(SMALL[name], "float32", seed=2)
    assert [t.shape for t in a] == [torch.Size(s) for s in w.input_shapes(SMALL[name])]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))
    assert all((t != 0).all() and t.unique().numel() > 1 for t in a)
    assert all(t.dtype == torch.float32 for t in a)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_reference_catches_a_perturbed_output(name: str) -> None:
    w = get_workload(name)
    inputs = w.make_inputs(SMALL[name], "float32", seed=5)
    out = w.torch_fn(*inputs).clone()
    out[0, 0] += 0.05 * out.abs().max()
    assert rel_error(out, w.reference(*inputs)) > w.tolerance("float32")


def test_costs() -> None:
    mm = get_workload("matmul")
    assert mm.flops({"M": 2, "N": 3, "K": 4}) == 48
    assert mm.bytes_moved({"M": 2, "N": 3, "K": 4}, "float32") == (8 + 12 + 6) * 4
    assert get_workload("softmax").bytes_moved({"M": 2, "N": 8}, "float32") == 2 * 16 * 4


def test_edge_problem_has_odd_sizes() -> None:
    edge = get_workload("matmul").edge_problem({"M": 64, "N": 128, "K": 32})
    assert edge == {"M": 63, "N": 127, "K": 31}
    assert get_workload("softmax").edge_problem({"M": 1, "N": 1}) is None


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ({"M": 4, "N": 4}, "missing K"),
        ({"M": 4, "N": 4, "K": 4, "B": 2}, "unknown B"),
        ({"M": 0, "N": 4, "K": 4}, "outside"),
        ({"M": "4", "N": 4, "K": 4}, "not an integer"),
    ],
)
def test_bad_problems_name_the_parameter(sizes: dict, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        get_workload("matmul").problem(sizes)


def test_key_for_checks_kernel_backend_and_dtype() -> None:
    with pytest.raises(InvalidInput, match="unknown kernel 'conv'; built-in: bias_gelu"):
        key_for("conv", "tvm", {"M": 1}, "float32")
    with pytest.raises(InvalidInput, match="has backends tvm, inductor, triton, not 'cuda'"):
        key_for("matmul", "cuda", {"M": 1, "N": 1, "K": 1}, "float32")
    with pytest.raises(InvalidInput, match="supports dtypes"):
        key_for("matmul", "tvm", {"M": 1, "N": 1, "K": 1}, "float17")
    # a near miss is pointed at the name it missed (matmull, tmv got only the lists)
    with pytest.raises(InvalidInput, match=r"unknown kernel 'matmull' \(did you mean 'matmul'\?\)"):
        key_for("matmull", "tvm", {"M": 1}, "float32")
    with pytest.raises(InvalidInput, match=r"not 'tmv' \(did you mean 'tvm'\?\)$"):
        key_for("matmul", "tmv", {"M": 1, "N": 1, "K": 1}, "float32")


def test_source_hash_depends_on_the_backend_sources() -> None:
    mm = get_workload("matmul")
    assert mm.source_hash("tvm") != mm.source_hash("inductor")
    assert mm.source_hash("tvm") != get_workload("bias_gelu").source_hash("tvm")
    key = key_for("matmul", "inductor", {"M": 4, "N": 4, "K": 4}, "float32")
    assert key.source_hash == mm.source_hash("inductor") and "torch" in key.environment


def test_shared_kernel_sources_are_in_the_source_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    bias_gelu = get_workload("bias_gelu")
    with_shared = bias_gelu.source_hash("triton")
    sources = {**bias_gelu.spec.sources, "triton": bias_gelu.spec.sources["triton"][:1]}
    monkeypatch.setattr(
        type(bias_gelu), "spec", dataclasses.replace(bias_gelu.spec, sources=sources)
    )
    assert bias_gelu.source_hash("triton") != with_shared  # matmul/triton.py's GEMM counts


def test_each_triton_kernels_jitted_helpers_are_in_its_source_hash_and_no_others() -> None:
    """A built-in's Triton file calling jitted helpers of ``workloads.triton_kit`` (``row_tile``;
    the norm kernels' loads and stores) has their files in its sources: a helper changed
    re-tunes the kernels that call it. The norm helpers are in the norm kernels' only (put
    beside ``row_tile``, they changed every Triton built-in's hash, matmul's too)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "workloads"
    jitted = {p.stem for p in (root / "triton_kit").glob("*.py") if "@_jit_like_triton" in
              p.read_text("utf-8")}  # fmt: skip
    assert {"launch", "norm"} <= jitted
    hashed = {}
    for name in sorted(WORKLOADS):
        tree = ast.parse((root / name / "triton.py").read_text("utf-8"))
        used = {node.module.rsplit(".", 1)[1] for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module
                and node.module.startswith("workloads.triton_kit.")} & jitted  # fmt: skip
        sources = get_workload(name).spec.sources["triton"]
        hashed[name] = {Path(f).stem for f in sources if Path(f).parent.name == "triton_kit"}
        assert used <= hashed[name], name
    assert {name for name, stems in hashed.items() if "norm" in stems} == {"layernorm", "rmsnorm"}
