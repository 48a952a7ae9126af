"""TVM knob spaces: enumerable, pruned with reasons, and every sampled config correct at any size."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from backends.tvm import TVMBackend
from backends.tvm.knobs import (
    FAMILIES,
    SCHEDULE_KNOBS,
    check_knobs,
    default_knobs,
    has_knobs,
    knob_space,
    summarize_knobs,
)
from tunecache.errors import InvalidInput
from tunecache.space import Config, SearchSpace
from workloads import WORKLOADS, get_workload
from workloads.base import Workload

DTYPE = "float32"
# Small tuned problems (fast to build and check) and the odd edge problems the tuner validates on.
PROBLEMS: dict[str, dict[str, int]] = {
    "matmul": {"M": 64, "N": 64, "K": 32},
    "bias_gelu": {"M": 64, "N": 64, "K": 32},
    "softmax": {"M": 16, "N": 128},
    "layernorm": {"M": 16, "N": 128},
    "rmsnorm": {"M": 16, "N": 128},
}
KNOB_WORKLOADS = sorted(name for name in PROBLEMS if name in WORKLOADS)
SAMPLES = 5  # random configs per workload, seeded


def rel_error(workload: Workload, out: Any, inputs: tuple[Any, ...]) -> float:
    ref = workload.reference(*inputs)
    assert tuple(out.shape) == tuple(ref.shape)
    return float((out.double() - ref).norm() / ref.norm())


def assert_correct(
    backend: TVMBackend,
    workload: Workload,
    problem: Mapping[str, int],
    config: Mapping[str, Any],
    seed: int,
) -> None:
    runnable = backend.build(workload, problem, DTYPE, config)
    inputs = workload.make_inputs(problem, DTYPE, seed)
    error = rel_error(workload, runnable(*inputs), inputs)
    assert error <= workload.tolerance(DTYPE), (
        f"{workload.name} {problem} {backend.summarize(config)}: error {error:.3g}"
    )


def sample_configs(space: SearchSpace, n: int, seed: int) -> list[Config]:
    configs = list(space.configs())
    return random.Random(seed).sample(configs, min(n, len(configs)))


@pytest.fixture(scope="module")
def backend() -> TVMBackend:
    pytest.importorskip("tvm")
    return TVMBackend()


# -- spaces (no TVM needed) -------------------------------------------------------------------
def test_every_knob_workload_is_registered() -> None:
    assert {get_workload(name).tvm_knobs for name in KNOB_WORKLOADS} <= set(FAMILIES)
    assert {"matmul", "bias_gelu", "softmax", "layernorm"} <= set(KNOB_WORKLOADS)
    for name in KNOB_WORKLOADS:
        assert has_knobs(name)
    assert not has_knobs("no_such_workload")


@pytest.mark.parametrize("name", KNOB_WORKLOADS)
def test_space_is_non_empty_and_complete_configs(name: str) -> None:
    workload = get_workload(name)
    space = knob_space(workload, PROBLEMS[name], DTYPE)
    configs = list(space.configs())
    assert configs
    assert space.params["schedule"] == (SCHEDULE_KNOBS,)
    for config in configs[:50]:
        check_knobs(workload, config.to_json())  # every config is a complete knob config
        assert summarize_knobs(config.to_json()).startswith("knobs ")


@pytest.mark.parametrize(
    ("key", "low", "high"),
    [
        ("matmul:M=256,N=256,K=256", 200, 2000),
        ("bias_gelu:M=256,N=256,K=256", 200, 2000),
        ("softmax:M=512,N=1024", 50, 500),
        ("layernorm:M=512,N=1024", 50, 500),
        ("rmsnorm:M=512,N=1024", 50, 500),
    ],
)
def test_space_sizes_at_the_landscape_keys(key: str, low: int, high: int) -> None:
    name, _, sizes = key.partition(":")
    if name not in WORKLOADS:
        pytest.skip(f"{name} is not a workload here")
    problem = {k: int(v) for k, v in (part.split("=") for part in sizes.split(","))}
    space = knob_space(get_workload(name), problem, DTYPE)
    assert low <= sum(1 for _ in space.configs()) <= high


@pytest.mark.parametrize("name", KNOB_WORKLOADS)
def test_pruned_configs_carry_a_reason(name: str) -> None:
    workload = get_workload(name)
    space = knob_space(workload, PROBLEMS[name], DTYPE)
    kept = set(space.configs())
    pruned = [c for c in space.all_configs() if c not in kept]
    assert pruned and len(pruned) == space.pruned_count()
    for config in pruned:
        reason = space.prune_reason(config)
        assert isinstance(reason, str) and reason
    for config in list(kept)[:20]:
        assert space.prune_reason(config) is None


def test_prune_reasons_name_the_cause() -> None:
    matmul = knob_space(get_workload("matmul"), {"M": 24, "N": 40, "K": 16}, DTYPE)
    base = Config.of(default_knobs("matmul")).replace(tile_i=8, tile_j=8, tile_k=8)
    assert matmul.prune_reason(base) is None
    assert matmul.prune_reason(base.replace(tile_i=32)) == "tile_i=32 exceeds M=24"
    assert matmul.prune_reason(base.replace(tile_k=32)) == "tile_k=32 exceeds K=16"
    big = knob_space(get_workload("matmul"), {"M": 256, "N": 256, "K": 256}, DTYPE)
    assert "accumulator" in str(big.prune_reason(base.replace(tile_i=64, tile_j=64)))
    rows = knob_space(get_workload("softmax"), {"M": 8, "N": 48}, DTYPE)
    config = Config.of(default_knobs("softmax"))
    assert rows.prune_reason(config.replace(rows=16)) == "rows=16 exceeds M=8"
    assert rows.prune_reason(config.replace(vector=64)) == "vector=64 exceeds N=48"
    assert "parallel" in str(rows.prune_reason(config.replace(parallel=False)))
    assert rows.prune_reason(config.replace(parallel=False, rows=1)) is None


def test_malformed_knob_configs_are_rejected() -> None:
    good = default_knobs("matmul")
    check_knobs("matmul", good)
    with pytest.raises(InvalidInput, match="missing"):
        check_knobs("matmul", {k: v for k, v in good.items() if k != "tile_k"})
    with pytest.raises(InvalidInput, match="unknown"):
        check_knobs("matmul", {**good, "rows": 4})
    with pytest.raises(InvalidInput, match="tile_i=3"):
        check_knobs("matmul", {**good, "tile_i": 3})
    with pytest.raises(InvalidInput, match="vectorize=1"):
        check_knobs("matmul", {**good, "vectorize": 1})  # an int is not a bool
    with pytest.raises(InvalidInput, match="tile_i=True"):
        check_knobs("matmul", {**good, "tile_i": True})  # nor a bool an int
    with pytest.raises(InvalidInput, match="not a knob config"):
        check_knobs("matmul", {**good, "schedule": "default"})
    with pytest.raises(InvalidInput, match="no TVM knob schedule"):
        check_knobs("attention", good)
    with pytest.raises(InvalidInput):
        knob_space(get_workload("matmul"), PROBLEMS["matmul"], "float16")


def test_summaries() -> None:
    backend = TVMBackend()
    gemm = {"schedule": "knobs", "tile_i": 32, "tile_j": 16, "tile_k": 8,
            "vectorize": True, "parallel": True, "unroll": 16}  # fmt: skip
    assert backend.summarize(gemm) == "knobs i32 j16 k8 vec par u16"
    assert backend.summarize({**gemm, "vectorize": False, "parallel": False, "unroll": 0}) == (
        "knobs i32 j16 k8"
    )
    rows = {"schedule": "knobs", "rows": 4, "vector": 16, "parallel": True, "unroll": 64}
    assert backend.summarize(rows) == "knobs r4 v16 par u64"
    assert backend.summarize({"schedule": "knobs"}) == "knobs (unreadable config)"


# -- builds (TVM) -----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", KNOB_WORKLOADS)
def test_default_and_sampled_configs_are_correct_at_tuned_and_edge_sizes(
    backend: TVMBackend, name: str
) -> None:
    workload = get_workload(name)
    problem = PROBLEMS[name]
    edge = workload.edge_problem(problem)
    assert edge is not None and all(v % 2 == 1 for v in edge.values())
    space = backend.space(workload, problem, DTYPE)
    assert space is not None
    configs = [Config.of(default_knobs(name)), *sample_configs(space, SAMPLES, seed=7)]
    for seed, config in enumerate(configs):
        assert_correct(backend, workload, problem, config.to_json(), seed)
        assert_correct(backend, workload, edge, config.to_json(), seed + 100)


@pytest.mark.slow
def test_extreme_configs_are_correct_at_odd_sizes(backend: TVMBackend) -> None:
    """Tiles and vectors far larger than the (prime-sized) problem: padding and predicates."""
    matmul, softmax = get_workload("matmul"), get_workload("softmax")
    problem = {"M": 7, "N": 13, "K": 5}
    for config in (
        {**default_knobs("matmul"), "tile_i": 64, "tile_j": 64, "tile_k": 32},
        {**default_knobs("matmul"), "tile_i": 1, "tile_j": 4, "tile_k": 1, "unroll": 64},
    ):
        assert_correct(backend, matmul, problem, config, seed=1)
    for vector in (1, 4, 64):
        config = {**default_knobs("softmax"), "rows": 32, "vector": vector}
        assert_correct(backend, softmax, {"M": 3, "N": 67}, config, seed=2)


@pytest.mark.slow
def test_space_and_build_round_trip_through_json(backend: TVMBackend) -> None:
    workload = get_workload("bias_gelu")
    problem = PROBLEMS["bias_gelu"]
    space = backend.space(workload, problem, DTYPE)
    assert space is not None
    config = sample_configs(space, 1, seed=3)[0]
    data = json.loads(json.dumps(config.to_json()))
    assert Config.from_json(data) == config
    assert space.contains(Config.from_json(data))
    assert data["schedule"] == "knobs"
    assert_correct(backend, workload, problem, data, seed=4)


@pytest.mark.slow
def test_build_rejects_bad_knob_configs(backend: TVMBackend) -> None:
    matmul = get_workload("matmul")
    problem = PROBLEMS["matmul"]
    with pytest.raises(InvalidInput):
        backend.build(matmul, problem, DTYPE, {"schedule": "knobs", "tile_i": 8})
    with pytest.raises(InvalidInput):  # a row config for a GEMM
        backend.build(matmul, problem, DTYPE, default_knobs("softmax"))


def test_space_is_none_without_a_knob_template(monkeypatch: pytest.MonkeyPatch) -> None:
    import backends.tvm.knobs as knobs

    monkeypatch.delitem(knobs.FAMILIES, "rows")
    assert TVMBackend().space(get_workload("softmax"), PROBLEMS["softmax"], DTYPE) is None
    assert TVMBackend.native_strategy == "meta_schedule"


# -- landscapes -------------------------------------------------------------------------------
@pytest.mark.slow
def test_recording_script_writes_a_valid_landscape(tmp_path: Path) -> None:
    pytest.importorskip("tvm")
    landscape_module = pytest.importorskip("tuner.landscape")
    from bench import record_landscapes

    argv = ["--out", str(tmp_path), "--keys", "softmax:M=8,N=48", "--sample", "4",
            "--repeats", "3", "--min-sample-ms", "0.2"]  # fmt: skip
    assert record_landscapes.main(argv) == 0
    path = tmp_path / "tvm-softmax-8x48-float32.json"
    landscape = landscape_module.Landscape.load(path)
    assert len(landscape.entries) == 4
    assert landscape.key["kernel"] == "softmax" and landscape.key["backend"] == "tvm"
    assert landscape.space["schedule"] == ["knobs"]
    assert "cores" in landscape.device and "time_evaluator" in landscape.note
    for entry in landscape.entries:
        assert entry.status == "ok", entry.error
        assert len(entry.times_ms) == 3 and all(t > 0 for t in entry.times_ms)
    assert landscape.optimum().time_ms is not None


@pytest.mark.slow
def test_recorder_reports_wrong_answers_and_compile_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tvm")
    pytest.importorskip("tuner.landscape")
    from bench import record_landscapes
    from tunecache.errors import TuningError

    spec = record_landscapes.KeySpec.parse("softmax:M=8,N=48")
    space = knob_space(spec.workload, spec.problem, DTYPE)
    configs = list(space.configs())[:2]
    recorder = record_landscapes.Recorder(
        spec, configs, timer=record_landscapes.Timer(repeats=2), batch=1
    )
    real_reference = recorder._reference
    recorder._reference = real_reference * 2  # every answer now disagrees with the reference
    entry = recorder.measure(configs[0])
    assert entry.status == "wrong_answer" and "relative error" in entry.error
    recorder._reference = real_reference

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise TuningError("knob schedule failed: boom")

    monkeypatch.setattr(record_landscapes, "apply_knobs", broken)
    entry = recorder.measure(configs[1])
    assert entry.status == "compile_error" and "boom" in entry.error


def test_key_specs_parse() -> None:
    from bench import record_landscapes

    spec = record_landscapes.KeySpec.parse("matmul:M=256,N=128,K=64")
    assert spec.workload.name == "matmul" and spec.problem == {"M": 256, "N": 128, "K": 64}
    assert spec.stem == "tvm-matmul-256x128x64-float32"
    for bad in ("matmul", "matmul:M=2,N=x,K=1", "matmul:M=2,N=2", "nope:M=1"):
        with pytest.raises(InvalidInput):
            record_landscapes.KeySpec.parse(bad)


@pytest.mark.slow
def test_cli_tune_writes_a_landscape_and_replays_it(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tuner.landscape import Landscape

    path = tmp_path / "softmax.json"
    base = [sys.executable, "-m", "tunecache_cli"]
    tuned = subprocess.run(
        [*base, "tune", "softmax", "--backend", "tvm", "--shape", "M=4,N=32", "--landscape",
         str(path), "--no-upload", "--workers", "2"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert tuned.returncode == 0, tuned.stderr
    landscape = Landscape.load(path)
    space = landscape.search_space()
    assert len(landscape.entries) == sum(1 for _ in space.configs()) > 10
    assert landscape.optimum().status == "ok"
    assert "pruned by device limits" in tuned.stderr
    replayed = subprocess.run([*base, "replay", str(path), "--trials", "10"],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
    assert replayed.returncode == 0 and "optuna" in replayed.stdout
