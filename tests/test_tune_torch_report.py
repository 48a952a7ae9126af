"""``tune --torch``'s summary: an op's fastest choice as Inductor timed it while compiling."""

from __future__ import annotations

from types import SimpleNamespace

from tunecache_cli.tune_torch import _choice_line


def _group(ms: float) -> SimpleNamespace:
    return SimpleNamespace(op="mm", timings={"cpp_CppMicroGemmFP32Vec-abc": ms, "aten-def": 2 * ms})


def test_a_choice_timed_longer_than_the_whole_model_is_said_to_rank_only() -> None:
    """On a CPU, "mm: cpp_CppMicroGemmFP32Vec 10.98 ms of 2 choices" stood under a compiled
    model of 0.026 ms, as if a GEMM of it took 400 times the model."""
    line = _choice_line(_group(10.98), compiled_ms=0.026)
    assert line.startswith("    mm: cpp_CppMicroGemmFP32Vec 10.98 ms of 2 choices")
    assert "422x the whole compiled model's" in line and "ranks the choices only" in line
    plain = _choice_line(_group(0.02), compiled_ms=0.026)  # a part within the whole
    assert plain == "    mm: cpp_CppMicroGemmFP32Vec 0.02 ms of 2 choices"
