"""The Inductor backend: real max-autotune searches and builds on CPU, on tiny shapes."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from backends import Budget, Progress, SearchRequest, SearchResult, get_backend  # noqa: E402
from backends.inductor import InductorBackend  # noqa: E402
from tests.factories import TINY, build_default  # noqa: E402
from tunecache.errors import InvalidInput, TuningError  # noqa: E402
from workloads import get_workload  # noqa: E402
from workloads.base import Workload  # noqa: E402
from workloads.matmul import Matmul  # noqa: E402

# torch.utils.mkldnn (imported by Inductor) defines TorchScript modules at import time.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")

DTYPE = "float32"
MATMUL = get_workload("matmul")
SOFTMAX = get_workload("softmax")
MATMUL_PROBLEM = {"M": 64, "N": 64, "K": 64}
SOFTMAX_PROBLEM = {"M": 32, "N": 128}


def rel_error(workload: Workload, out: Any, inputs: tuple[Any, ...]) -> float:
    ref = workload.reference(*inputs)
    assert out.shape == ref.shape
    return float((out.double() - ref).norm() / ref.norm())


def assert_correct(workload: Workload, runnable: Any, problem: Mapping[str, int], seed: int) -> Any:
    inputs = workload.make_inputs(problem, DTYPE, seed)
    out = runnable(*inputs)
    assert rel_error(workload, out, inputs) <= workload.tolerance(DTYPE)
    return out


@pytest.fixture(scope="module")
def backend() -> Iterator[InductorBackend]:
    yield InductorBackend()
    torch._dynamo.reset()  # frees this module's compiled code


@pytest.fixture(scope="module")
def matmul_search(
    backend: InductorBackend, tmp_path_factory: pytest.TempPathFactory
) -> tuple[SearchResult, list[Progress], Path]:
    workdir = tmp_path_factory.mktemp("inductor-matmul")
    reports: list[Progress] = []
    request = SearchRequest(MATMUL, MATMUL_PROBLEM, DTYPE, Budget(trials=4), reports.append)
    result = backend.search(request, workdir=workdir)
    return result, reports, workdir


@pytest.fixture(scope="module")
def softmax_search(
    backend: InductorBackend, tmp_path_factory: pytest.TempPathFactory
) -> SearchResult:
    workdir = tmp_path_factory.mktemp("inductor-softmax")
    return backend.search(
        SearchRequest(SOFTMAX, SOFTMAX_PROBLEM, DTYPE, Budget(trials=4)), workdir=workdir
    )


# -- fast: no compile ---------------------------------------------------------------------------
def test_registered_and_available() -> None:
    backend = get_backend("inductor")
    assert isinstance(backend, InductorBackend)
    assert backend.unavailable_reason() is None


def test_the_tunes_first_line_says_what_the_budget_bounds(backend: InductorBackend) -> None:
    """Inductor benchmarks every choice it has: its budget caps only the re-timed ones, and no
    time budget bounds its compile (a tune's first line said ``(32 trials)`` and searched 2)."""
    said = backend.budget_text(Budget(trials=32, seconds=10))
    assert "up to 3 of its choices re-timed" in said and "not bounded by a time budget" in said
    assert backend.budget_text(Budget(trials=1)) == "one max-autotune compile, then its pick"
    generic = get_backend("tvm").budget_text(Budget(trials=200, seconds=20, patience=30))
    assert generic == "200 trials or 20 s, stopping after 30 without gain"


def test_summarize() -> None:
    backend = InductorBackend()
    assert backend.summarize({"mode": "default"}) == "default"
    config = {
        "mode": "max-autotune",
        "freezing": True,
        "frozen": [1],
        "choice": "cpp_CppMicroGemmFP32Vec",
        "choices": {"cpp_CppMicroGemmFP32Vec": 0.0312, "_mkl_linear": 0.045},
    }
    assert backend.summarize(config) == (
        "max-autotune: cpp_CppMicroGemmFP32Vec (0.0312 ms) of 2 choices"
    )
    fused = {"mode": "max-autotune", "freezing": True, "frozen": [], "choice": "fused-cpp"}
    assert backend.summarize(fused) == "max-autotune: fused-cpp"


@pytest.mark.parametrize(
    "config",
    [{"mode": "reduce-overhead"}, {}, {"mode": "max-autotune", "frozen": [5]}],
)
def test_build_rejects_foreign_configs(config: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        InductorBackend().build(MATMUL, MATMUL_PROBLEM, DTYPE, config)


# -- slow: real compiles ------------------------------------------------------------------------
@pytest.mark.slow
def test_matmul_search_benchmarks_gemm_choices(
    backend: InductorBackend, matmul_search: tuple[SearchResult, list[Progress], Path]
) -> None:
    result, reports, workdir = matmul_search
    assert result.strategy == "inductor_max_autotune"
    assert result.seconds > 0 and result.runnable is not None
    ok = [t for t in result.trials if t.status == "ok"]
    # Freezing makes CPU max-autotune benchmark the MKL extern kernel against the C++ template.
    assert len(ok) >= 2
    assert all(t.time_ms is not None and t.time_ms > 0 for t in ok)
    names = {t.config["choice"] for t in ok}
    assert "_mkl_linear" in names and any(n.startswith("cpp_") for n in names)
    config = result.config
    assert config["mode"] == "max-autotune" and config["freezing"] is True
    assert config["frozen"] == [1] and config["op"] == "packed_linear"
    assert config["choice"] in config["choices"] and config["backend"] in ("ATEN", "CPP")
    assert set(config["retimed"]) == names  # both pinned choices re-timed end to end
    assert [r["choice"] for r in result.ranked[1:]] == sorted(names - {config["choice"]})
    assert reports[0].done == 0 and reports[-1].done == reports[-1].total == 2
    assert reports[-1].best_ms is not None
    assert config["choice"] in backend.summarize(config)
    logged = json.loads((workdir / "inductor_search.json").read_text())
    assert logged["config"] == json.loads(json.dumps(config))
    assert observers_left() == 0


@pytest.mark.slow
def test_matmul_winner_is_correct_and_honours_new_inputs(
    matmul_search: tuple[SearchResult, list[Progress], Path],
) -> None:
    result, _, _ = matmul_search
    assert result.runnable is not None
    first = assert_correct(MATMUL, result.runnable, MATMUL_PROBLEM, seed=11)
    second = assert_correct(MATMUL, result.runnable, MATMUL_PROBLEM, seed=12)
    assert not torch.allclose(first, second)  # the second call's weights were honoured


@pytest.mark.slow
def test_config_round_trips_and_builds_at_the_edge(
    backend: InductorBackend, matmul_search: tuple[SearchResult, list[Progress], Path]
) -> None:
    result, _, _ = matmul_search
    edge = MATMUL.edge_problem(MATMUL_PROBLEM)
    assert edge == {"M": 63, "N": 63, "K": 63}
    for config in result.ranked:  # the winner and the runner-up
        restored = json.loads(json.dumps(config))
        assert restored == config
        runnable = backend.build(MATMUL, edge, DTYPE, restored)
        assert_correct(MATMUL, runnable, edge, seed=3)


@pytest.mark.slow
def test_frozen_runnable_tracks_weights_and_returns_fresh_outputs(
    backend: InductorBackend,
) -> None:
    problem = TINY["matmul"]
    config = {"mode": "max-autotune", "freezing": True, "frozen": [1], "backend": "CPP"}
    runnable = backend.build(MATMUL, problem, DTYPE, config)
    a, b = MATMUL.make_inputs(problem, DTYPE, seed=1)
    out1 = runnable(a, b)
    out2 = runnable(a, b)
    assert out1.data_ptr() != out2.data_ptr() and torch.equal(out1, out2)
    out2.fill_(0.0)  # scribbling on one output leaves the next call alone
    assert torch.equal(runnable(a, b), out1)
    b.mul_(-2.0)  # an in-place update of a frozen weight is a new weight set
    updated = runnable(a, b)
    assert rel_error(MATMUL, updated, (a, b)) <= MATMUL.tolerance(DTYPE)
    assert torch.allclose(updated, -2.0 * out1, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_many_weight_sets_never_fall_back_to_eager(backend: InductorBackend) -> None:
    # Dynamo stops compiling a code object after 8 recompiles and silently runs it eagerly; each
    # weight set compiles its own code object, so every one of them is really compiled.
    from torch._dynamo.utils import counters

    problem = {"M": 8, "N": 8, "K": 8}
    config = {"mode": "max-autotune", "freezing": True, "frozen": [1], "backend": "ATEN"}
    runnable = backend.build(MATMUL, problem, DTYPE, config)
    graphs = counters["stats"]["unique_graphs"]
    for seed in range(10):
        assert_correct(MATMUL, runnable, problem, seed)
    assert counters["stats"]["unique_graphs"] - graphs == 10


@pytest.mark.slow
def test_softmax_search_times_the_fused_kernel(softmax_search: SearchResult) -> None:
    result = softmax_search
    assert len(result.trials) == 1
    trial = result.trials[0]
    assert trial.status == "ok" and trial.time_ms is not None and trial.time_ms > 0
    assert result.config == {
        "mode": "max-autotune",
        "freezing": True,
        "frozen": [],
        "choice": "fused-cpp",
    }
    assert result.runnable is not None
    assert_correct(SOFTMAX, result.runnable, SOFTMAX_PROBLEM, seed=5)
    edge = SOFTMAX.edge_problem(SOFTMAX_PROBLEM)
    assert edge is not None
    built = InductorBackend().build(SOFTMAX, edge, DTYPE, json.loads(json.dumps(result.config)))
    assert_correct(SOFTMAX, built, edge, seed=6)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TINY))
def test_default_build_is_correct(backend: InductorBackend, name: str) -> None:
    workload, problem, runnable = build_default(backend, name)
    first = assert_correct(workload, runnable, problem, seed=1)
    second = assert_correct(workload, runnable, problem, seed=2)
    assert not torch.allclose(first, second)


@pytest.mark.slow
def test_bias_gelu_max_autotune_build_fuses_correctly(backend: InductorBackend) -> None:
    workload = get_workload("bias_gelu")
    problem = {"M": 17, "N": 33, "K": 15}  # odd sizes: the template's ragged edges
    for pinned in ("CPP", "ATEN"):
        config = {"mode": "max-autotune", "freezing": True, "frozen": [1, 2], "backend": pinned}
        runnable = backend.build(workload, problem, DTYPE, config)
        assert_correct(workload, runnable, problem, seed=4)


class _Broken(Matmul):
    def torch_fn(self, a: Any, b: Any) -> Any:  # type: ignore[override]
        raise RuntimeError("no kernel here")


def test_failed_compile_is_a_compile_error_trial(
    backend: InductorBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def not_compiled(*args: Any) -> Any:
        raise RuntimeError("no kernel here")

    # Inductor fails on a torch_fn that runs eagerly: the default config is the candidate.
    monkeypatch.setattr(torch, "compile", lambda fn, **options: not_compiled)
    request = SearchRequest(MATMUL, {"M": 8, "N": 8, "K": 8}, DTYPE, Budget())
    result = backend.search(request, workdir=tmp_path)
    assert result.config == {"mode": "default"} and result.runnable is None
    assert [t.status for t in result.trials] == ["compile_error"]
    assert "no kernel here" in result.trials[0].error
    assert observers_left() == 0


def test_a_torch_fn_that_raises_fails_the_search_naming_it(
    backend: InductorBackend, tmp_path: Path
) -> None:
    # Dynamo wraps the user's exception in its own ("Unsupported: Observed exception", the
    # user's only as a repr in the debug text): no config can pass, the search says why.
    request = SearchRequest(_Broken(), {"M": 8, "N": 8, "K": 8}, DTYPE, Budget())
    with pytest.raises(TuningError) as raised:
        backend.search(request, workdir=tmp_path)
    # a built-in's subclass stays the built-in (a user's kernel's is a kernel of its own)
    assert str(raised.value) == "matmul: torch_fn raised RuntimeError: no kernel here"
    assert observers_left() == 0


def observers_left() -> int:
    """Feedback savers a search left registered with Inductor (it must remove its own)."""
    from torch._inductor import select_algorithm

    savers = getattr(select_algorithm._ALGORITHM_SELECTOR_CACHE, "feedback_saver_fns", [])
    return sum(type(getattr(fn, "__self__", None)).__name__ == "ChoiceObserver" for fn in savers)
