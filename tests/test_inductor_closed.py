"""Closed schemas of everything Inductor-related a server can serve, and Inductor's own guards.

- :mod:`tunecache.configcheck.inductor` on the search's real config shapes (``_from_ops`` on real
  ``AutotunedOp`` values, a real tiny search) and on hostile values;
- ``inductor.choices`` / ``inductor.autotune`` values: refused by the real server at upload (422
  naming the field) and dropped by the client when a hostile server at the client's transport
  (``httpx.MockTransport``) answers them;
- the ``AutotuneCache.read_best`` guard with real ``triton.Config`` objects and a real
  ``AutotuneCache`` (no GPU needed): a served config outside the kernel's list is never returned;
- real Inductor (CPU max-autotune with freezing, in subprocesses): a served choice group naming
  choices Inductor does not offer changes nothing.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import textwrap
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.inductor.observe import AutotunedOp, ChoiceTiming
from backends.inductor.options import GEMM_BACKENDS as OPTIONS_GEMM_BACKENDS
from backends.inductor.search import _from_ops
from tests import inductor_runs
from tests.conftest import LiveServer
from tunecache.artifacts import ArtifactIn
from tunecache.client import Client
from tunecache.configcheck import artifact_problem
from tunecache.configcheck import config_problem as dispatch_config_problem
from tunecache.configcheck.inductor import (
    GEMM_BACKENDS,
    MAX_CHOICES,
    best_config_problem,
    choice_group_problem,
    config_problem,
)
from tunecache.inductor import autotune
from tunecache.inductor.autotune import AutotuneStore, installed, sanitise_best_config
from tunecache.inductor.choices import ChoiceGroup
from tunecache.inductor.remote import TeamCache, TeamCacheWarning

BASE: dict[str, Any] = {"mode": "max-autotune", "freezing": True, "frozen": [1]}

# torch.utils.mkldnn (imported by Inductor) defines TorchScript modules at import time.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")


# -- configs of records (backend "inductor") ----------------------------------------------------
def _op(name: str, *choices: tuple[str, str | None, float]) -> AutotunedOp:
    op = AutotunedOp(name)
    op.choices = [ChoiceTiming(*c) for c in sorted(choices, key=lambda c: c[2])]
    return op


def _search_configs() -> list[dict[str, Any]]:
    """Every config shape the search writes (``_from_ops``, and what ``_pick_retimed`` adds)."""
    linear = _op("packed_linear", ("cpp_CppMicroGemmFP32Vec", "CPP", 0.0098),
                 ("_mkl_linear", "ATEN", 0.021), ("cpp_broken", "CPP", math.inf))  # fmt: skip
    single = _from_ops(BASE, [linear])
    several = _from_ops(BASE, [linear, _op("mm", ("triton_mm", "TRITON", 0.5))])
    failed = _from_ops(BASE, [_op("mm", ("a", None, math.inf))])
    retimed = {**single.config, "retimed": {"cpp_CppMicroGemmFP32Vec": 0.031, "_mkl_linear": None},
               "inductor_choice": "_mkl_linear"}  # fmt: skip
    return [
        {"mode": "default"},
        {"mode": "max-autotune"},
        {"mode": "max-autotune", "freezing": True, "frozen": [1], "backend": "CPP"},
        _from_ops({**BASE, "frozen": []}, []).config,  # fused-cpp
        *single.ranked,
        several.config,
        failed.config,
        retimed,
    ]


def test_the_search_config_shapes_are_served() -> None:
    configs = _search_configs()
    assert any("backend" in c and "choices" in c for c in configs)  # the shapes are really there
    assert any(c.get("choices", {}).get("cpp_broken", 1) is None for c in configs)
    for config in configs:
        assert config_problem(config) is None, config
        assert dispatch_config_problem("inductor", json.loads(json.dumps(config))) is None


def test_the_gemm_backends_have_one_home() -> None:
    assert OPTIONS_GEMM_BACKENDS is GEMM_BACKENDS
    for backend in GEMM_BACKENDS:
        assert config_problem({**BASE, "backend": backend}) is None


@pytest.mark.parametrize(
    ("config", "names"),
    [
        ([], "object"),
        ({}, "mode=None"),
        ({"mode": "reduce-overhead"}, "mode='reduce-overhead'"),
        ({"mode": "default", "backend": "ATEN"}, "'backend' is not allowed"),
        ({**BASE, "code": "import os"}, "'code' is not a key"),
        ({**BASE, "max_autotune_gemm_backends": "ATEN"}, "'max_autotune_gemm_backends'"),
        ({**BASE, "backend": "MY_PLUGIN"}, "backend='MY_PLUGIN'"),
        ({**BASE, "backend": "aten"}, "backend='aten'"),
        ({**BASE, "backend": ["ATEN", "CPP"]}, "backend=["),
        ({**BASE, "freezing": "yes"}, "freezing='yes'"),
        ({**BASE, "freezing": 1}, "freezing=1"),
        ({**BASE, "frozen": [True]}, "frozen[0]=True"),
        ({**BASE, "frozen": [-1]}, "frozen[0]=-1"),
        ({**BASE, "frozen": [1.0]}, "frozen[0]=1.0"),
        ({**BASE, "frozen": [1, 1]}, "names an input twice"),
        ({**BASE, "frozen": "1"}, "frozen='1'"),
        ({**BASE, "op": 5}, "op=5"),
        ({**BASE, "choice": "a\nb"}, "choice="),
        ({**BASE, "choice": "x" * 5000}, "choice="),
        ({**BASE, "choices": {"a": float("nan")}}, "choices['a']=nan"),
        ({**BASE, "choices": {"a": float("inf")}}, "choices['a']=inf"),
        ({**BASE, "choices": {"a": -0.5}}, "choices['a']=-0.5"),
        ({**BASE, "choices": {"a": "0.5"}}, "choices['a']='0.5'"),
        ({**BASE, "choices": {"a": True}}, "choices['a']=True"),
        ({**BASE, "choices": {"a": {"ms": 1}}}, "choices['a']="),
        ({**BASE, "choices": {"": 1.0}}, "choices: '' is not a choice name"),
        ({**BASE, "choices": {"x" * 600: 1.0}}, "is not a choice name"),
        ({**BASE, "choices": {}}, "choices has 1 to"),
        ({**BASE, "choices": [["a", 1.0]]}, "choices is an object"),
        ({**BASE, "choices": {f"c{i}": 1.0 for i in range(MAX_CHOICES + 1)}}, "choices has 1 to"),
        ({**BASE, "retimed": {"a": -1}}, "retimed['a']=-1"),
    ],
)  # fmt: skip
def test_a_hostile_config_is_refused_naming_the_field(config: Any, names: str) -> None:
    why = config_problem(config)
    assert why is not None and names in why, why
    assert dispatch_config_problem("inductor", config) == why


@pytest.mark.slow
def test_a_real_tiny_search_writes_configs_the_schema_serves(tmp_path: Path) -> None:
    from backends import Budget, SearchRequest
    from backends.inductor import InductorBackend
    from workloads import get_workload

    request = SearchRequest(get_workload("matmul"), {"M": 16, "N": 16, "K": 16}, "float32",
                            Budget(trials=2))  # fmt: skip
    result = InductorBackend().search(request, workdir=tmp_path)
    assert result.config.get("choices"), result.config  # GEMM choices were benchmarked
    assert "retimed" in result.config and "backend" in result.config  # pinned and re-timed
    for config in result.ranked:
        assert config_problem(json.loads(json.dumps(config))) is None, config


# -- inductor.choices ---------------------------------------------------------------------------
GROUP: dict[str, Any] = {"op": "packed_linear", "inputs": "[('cpu', 'torch.float32', 8, 8)]",
                         "precision": "highest", "timings": {"a-1": 0.5, "b-2": 0.25, "c-3": None}}  # fmt: skip
TIMED: dict[str, Any] = {**GROUP, "timings": {"a-1": 0.5, "b-2": 0.25}}  # a served GROUP, merged


@pytest.mark.parametrize(
    ("value", "names"),
    [
        (None, "object"),
        ([GROUP], "object"),
        ({**GROUP, "code": "x"}, "'code' is not a key"),
        ({k: v for k, v in GROUP.items() if k != "op"}, "op=None"),
        ({**GROUP, "op": ""}, "op=''"),
        ({**GROUP, "inputs": "a\x00b"}, "inputs="),
        ({**GROUP, "precision": "p" * 65}, "precision="),
        ({**GROUP, "timings": {}}, "timings has 1 to"),
        ({**GROUP, "timings": {"a": float("nan")}}, "timings['a']=nan"),
        ({**GROUP, "timings": {"a": float("inf")}}, "timings['a']=inf"),
        ({**GROUP, "timings": {"a": -1.0}}, "timings['a']=-1.0"),
        ({**GROUP, "timings": {"a": 1e300}}, "timings['a']=1e+300"),
        ({**GROUP, "timings": {"a": None}}, "every one failed"),
        ({**GROUP, "timings": {f"h{i}": 1.0 for i in range(MAX_CHOICES + 1)}}, "timings has 1 to"),
    ],
)  # fmt: skip
def test_a_hostile_choice_group_is_refused_naming_the_field(value: Any, names: str) -> None:
    why = choice_group_problem(value)
    assert why is not None and names in why, why
    assert artifact_problem("inductor.choices", value) == why
    assert ChoiceGroup.from_value(value) is None


def test_a_good_choice_group_passes_and_round_trips_without_its_failures() -> None:
    assert choice_group_problem(GROUP) is None
    group = ChoiceGroup.from_value(GROUP)
    assert group is not None and group.to_value() == TIMED
    assert choice_group_problem(group.to_value()) is None


def test_a_served_group_of_failures_beside_a_made_up_time_keeps_only_that_time() -> None:
    value = {**GROUP, "timings": {"a-1": None, "b-2": None, FOREIGN: 0.001}}
    assert choice_group_problem(value) is None  # the server cannot tell whose hashes they are
    group = ChoiceGroup.from_value(value)
    assert group is not None and dict(group.timings) == {FOREIGN: 0.001}


# -- inductor.autotune ----------------------------------------------------------------------------
CONFIGS_HASH = "c0ffee"


META: dict[str, Any] = {"autotune_local_cache": False, "autotune_remote_cache": True,
                        "backend_hash": "backend", "coordinate_descent_tuning": False}  # fmt: skip


def _autotune_cache(tmp_path: Path, meta: dict[str, Any]) -> Any:
    from torch._inductor.runtime.autotune_cache import AutotuneCache

    cache = AutotuneCache.create(meta, str(tmp_path / "ab" / "cabkernel.py"), CONFIGS_HASH)
    assert cache is not None
    return cache


def _listed() -> list[Any]:
    import triton

    return [triton.Config({"XBLOCK": 64, "R0_BLOCK": 8}, num_warps=4, num_stages=1),
            triton.Config({"XBLOCK": 128, "R0_BLOCK": 8}, num_warps=4, num_stages=1)]  # fmt: skip


def _saved(tmp_path: Path, config: Any, *, found_by_coordesc: bool = False) -> dict[str, Any]:
    """What Inductor's own ``AutotuneCache.save`` writes for ``config`` (its local cache file)."""
    meta = {**META, "autotune_local_cache": True, "autotune_remote_cache": False}
    cache = _autotune_cache(tmp_path, meta)
    cache.save(config, 12_000_000, found_by_coordesc=found_by_coordesc)
    _, path = cache.local_cache
    return json.loads(Path(path).read_text())


def test_what_inductor_saves_passes_and_coordinate_descent_does_not(tmp_path: Path) -> None:
    listed = _listed()
    saved = _saved(tmp_path / "plain", listed[1])
    assert saved["XBLOCK"] == 128 and saved["configs_hash"] == CONFIGS_HASH
    assert best_config_problem(saved) is None
    assert sanitise_best_config(saved) == saved
    why = best_config_problem(_saved(tmp_path / "coordesc", listed[1], found_by_coordesc=True))
    assert why is not None and why.startswith("found_by_coordesc=True")


BEST: dict[str, Any] = {"XBLOCK": 128, "R0_BLOCK": 8, "num_warps": 4, "num_stages": 1,
                        "configs_hash": CONFIGS_HASH, "found_by_coordesc": False,
                        "time_taken_ms": 12, "triton_cache_hash": None}  # fmt: skip


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ([BEST], "object"),
        ({}, "1 to 64 fields"),
        ({**BEST, "found_by_coordesc": True}, "found_by_coordesc=True"),
        ({**BEST, "found_by_coordesc": "false"}, "found_by_coordesc='false'"),
        ({**BEST, "extra_options": {"cmd": "rm -rf /"}}, "extra_options="),
        ({**BEST, "extra_options": []}, "extra_options="),
        ({**BEST, "num_warps": 4.0}, "num_warps=4.0"),
        ({**BEST, "num_warps": True}, "num_warps=True"),
        ({**BEST, "num_stages": -1}, "num_stages=-1"),
        ({**BEST, "num_warps": 4096}, "num_warps=4096"),
        ({k: v for k, v in BEST.items() if k != "configs_hash"}, "configs_hash is missing"),
        ({**BEST, "configs_hash": 3}, "configs_hash=3"),
        ({**BEST, "triton_cache_hash": ["x"]}, "triton_cache_hash="),
        ({**BEST, "time_taken_ms": -5}, "time_taken_ms=-5"),
        ({**BEST, "XBLOCK": "128"}, "XBLOCK='128'"),
        ({**BEST, "XBLOCK": [128]}, "XBLOCK=[128]"),
        ({**BEST, "XBLOCK": {"nested": 1}}, "XBLOCK="),
        ({**BEST, "XBLOCK": None}, "XBLOCK=None"),
        ({**BEST, "XBLOCK": float("nan")}, "XBLOCK=nan"),
        ({**BEST, "XBLOCK": 2**40}, "outside int32"),
        ({**BEST, "__import__('os')": 1}, "is not a meta-parameter name"),
        ({**BEST, **{f"k{i}": i for i in range(100)}}, "1 to 64 fields"),
    ],
)  # fmt: skip
def test_a_hostile_best_config_is_refused_naming_the_field(value: Any, names: str) -> None:
    why = best_config_problem(value)
    assert why is not None and names in why, why
    assert artifact_problem("inductor.autotune", value) == why
    assert sanitise_best_config(value) is None


# -- the server refuses them at upload ----------------------------------------------------------
def test_the_server_refuses_hostile_inductor_values_naming_the_field(server: LiveServer) -> None:
    bad = {
        "inductor.autotune": {**BEST, "extra_options": {"a": 1}},
        "inductor.choices": {**GROUP, "timings": {"a": -1.0}},
    }
    for namespace, value in bad.items():
        body = {"items": [{"namespace": namespace, "partition": "p", "key": "k", "value": value}]}
        response = httpx.post(f"{server.url}/v1/artifacts", json=body, timeout=10,
                              headers={"Authorization": f"Bearer {os.environ['TUNECACHE_TOKEN']}"})  # fmt: skip
        assert response.status_code == 422, response.text
        field = "extra_options" if namespace == "inductor.autotune" else "timings['a']"
        assert field in response.text
    good = [ArtifactIn(namespace="inductor.autotune", partition="p", key="k", value=BEST),
            ArtifactIn(namespace="inductor.choices", partition="p", key="g", value=GROUP)]  # fmt: skip
    with Client(server.url) as client:
        assert client.put_artifacts(good).stored == 2


# -- a hostile server at the client's transport ----------------------------------------------------
class Hostile:
    """A server at the client's transport answering every artifact read with ``values[ns]``."""

    def __init__(self, values: dict[str, list[Any]]) -> None:
        self.values = values
        self.reads = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.reads += 1
        params = dict(request.url.params)
        namespace = params["namespace"]
        items = [{"namespace": namespace, "partition": params["partition"],
                  "key": params.get("key", f"k{i}"), "item": "", "value": value, "score": None,
                  "id": i + 1, "updated_at": "2025-01-01T00:00:00Z"}
                 for i, value in enumerate(self.values.get(namespace, []))]  # fmt: skip
        return httpx.Response(200, json={"items": items, "next_after": None})

    def team(self, partition: str = "part") -> TeamCache:
        team = TeamCache("http://hostile.test", "t", partition, timeout=2.0)
        team.client.close()
        team.client = Client("http://hostile.test", transport=httpx.MockTransport(self),
                             token="t", timeout=2.0)  # fmt: skip
        return team


HOSTILE_BEST: list[Any] = [
    {**BEST, "found_by_coordesc": True},
    {**BEST, "extra_options": {"a": 1}},
    {**BEST, "num_warps": "4"},
    {**BEST, "XBLOCK": "128"},
    {**BEST, "XBLOCK": {"a": [1]}},
    [BEST],
    {"x": None},
]


@pytest.mark.parametrize("value", HOSTILE_BEST, ids=range(len(HOSTILE_BEST)))
def test_a_hostile_best_config_answer_is_dropped(value: Any) -> None:
    hostile = Hostile({"inductor.autotune": [value]})
    store = AutotuneStore(hostile.team())
    backend = autotune.backend_class(store)()
    assert backend.get("pt2:kernel::key:c1") is None
    assert hostile.reads == 1  # the answer did arrive: the client refused it
    control = AutotuneStore(Hostile({"inductor.autotune": [BEST]}).team())
    assert json.loads(autotune.backend_class(control)().get("pt2:kernel::key:c1")) == BEST


HOSTILE_GROUPS: list[Any] = [
    {**GROUP, "timings": {"a": -1.0}},
    {**GROUP, "timings": {"a": None}},
    {**GROUP, "timings": {"a": "0.1"}},
    {**GROUP, "timings": {"x" * 600: 0.1}},
    {**GROUP, "op": 5},
    {**GROUP, "extra": "key"},
    ["not", "a", "group"],
]


@pytest.fixture
def inductor_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Restores what :func:`tunecache.inductor.enable` sets process-wide."""
    from torch._inductor import config
    from torch._inductor.codecache import CacheBase
    from torch._inductor.remote_cache import RemoteAutotuneCache
    from torch._inductor.runtime.autotune_cache import AutotuneCache

    import tunecache.inductor

    monkeypatch.setattr(RemoteAutotuneCache, "backend_override_cls", None)
    # Unguarded for the test, whatever an earlier test's enable() left installed; then restored.
    method = AutotuneCache.__dict__["read_best"]
    monkeypatch.setattr(AutotuneCache, "read_best", getattr(method, autotune._GUARD, method))
    monkeypatch.setattr(tunecache.inductor, "_active", None)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    CacheBase.get_local_cache_path.cache_clear()
    with config.patch(autotune_remote_cache=config.autotune_remote_cache):
        yield
    CacheBase.get_local_cache_path.cache_clear()


def test_hostile_choice_groups_from_the_transport_are_dropped_by_enable(
    inductor_state: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tunecache.inductor
    from tunecache.inductor.choices import local_cache_path, read_groups

    hostile = Hostile({"inductor.choices": [*HOSTILE_GROUPS, GROUP]})
    monkeypatch.setattr(tunecache.inductor, "TeamCache", lambda *a, **k: hostile.team())
    with warnings.catch_warnings():
        warnings.simplefilter("error", TeamCacheWarning)
        enabled = tunecache.inductor.enable("http://hostile.test")
    assert (enabled.fetched, enabled.ignored, enabled.merged) == (1, len(HOSTILE_GROUPS), 1)
    assert [g.to_value() for g in read_groups(local_cache_path())] == [TIMED]


# -- AutotuneCache.read_best: only the kernel's own configs ----------------------------------------
def _read_best(
    tmp_path: Path, served: dict[str, Any], configs: list[Any], meta: dict[str, Any] = META
) -> Any:
    """What ``read_best`` returns for ``configs`` while ``served`` comes from the team cache."""
    store = AutotuneStore(Hostile({"inductor.autotune": [served]}).team())
    with installed(store):
        return _autotune_cache(tmp_path, meta).read_best(meta, configs)


@pytest.fixture
def listed(inductor_state: None, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    monkeypatch.setattr(autotune, "_warned", False)
    return _listed()


def test_a_served_config_outside_the_list_is_not_returned(
    listed: list[Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from torch._inductor.runtime.autotune_cache import AutotuneCache

    original = AutotuneCache.__dict__["read_best"]
    outside = {**BEST, "XBLOCK": 4096}
    store = AutotuneStore(Hostile({"inductor.autotune": [outside]}).team())
    with installed(store):
        cache = _autotune_cache(tmp_path, META)
        assert original(cache, META, listed).kwargs["XBLOCK"] == 4096  # Inductor would launch it
        with caplog.at_level("DEBUG", logger=autotune.__name__):
            assert cache.read_best(META, listed) is None
            assert cache.read_best(META, listed) is None
    mine = [r.levelname for r in caplog.records if r.name == autotune.__name__]
    assert mine == ["WARNING", "DEBUG"]  # a warning once, then a debug line
    assert "none of the kernel's own configs" in caplog.text


def test_a_served_config_outside_the_list_is_never_among_inductors_cache_artifacts(
    listed: list[Any], tmp_path: Path
) -> None:
    """Inductor records what its remote cache answers (``save_cache_artifacts``); loaded on
    another machine, a recorded best config becomes a local one, which Inductor rebuilds and
    launches: the guard dropped it after the read, and it was recorded all the same."""
    import torch.compiler
    from torch.compiler._cache import CacheArtifactManager

    CacheArtifactManager.clear()
    try:
        assert _read_best(tmp_path, {**BEST, "XBLOCK": 4096}, listed) is None
        # a listed config of another kernel's configs: Inductor ignores it here, but recorded,
        # a machine where that hash is the kernel's rebuilds it from its values
        assert _read_best(tmp_path, {**BEST, "configs_hash": "b" * 64}, listed) is None
        assert torch.compiler.save_cache_artifacts() is None  # nothing recorded
        assert _read_best(tmp_path, BEST, listed) is listed[1]
        saved = torch.compiler.save_cache_artifacts()  # a listed one is, as Inductor does
        assert saved is not None and len(saved[1].artifacts["autotune"]) == 1
    finally:
        CacheArtifactManager.clear()


def test_a_served_config_in_the_list_selects_the_listed_one(
    listed: list[Any], tmp_path: Path
) -> None:
    assert _read_best(tmp_path, BEST, listed) is listed[1]
    assert _read_best(tmp_path, {**BEST, "XBLOCK": 64}, listed) is listed[0]


def test_duplicated_listed_configs_are_not_a_selection(listed: list[Any], tmp_path: Path) -> None:
    listed.append(_listed()[1])  # two listed configs equal to the served one
    assert _read_best(tmp_path, BEST, listed) is None


def test_coordinate_descent_is_never_rebuilt_from_the_team(
    listed: list[Any], tmp_path: Path
) -> None:
    meta = {**META, "coordinate_descent_tuning": True}
    # The schema drops it at the store; the guard would drop its rebuilt config too.
    assert _read_best(tmp_path, {**BEST, "found_by_coordesc": True}, listed, meta) is None
    assert _read_best(tmp_path, BEST, listed, meta) is listed[1]


def test_the_local_cache_answers_as_before(listed: list[Any], tmp_path: Path) -> None:
    meta = {**META, "autotune_local_cache": True}
    cache = _autotune_cache(tmp_path, meta)
    local, key = cache.local_cache
    local.put(key, {**BEST, "XBLOCK": 256})  # Inductor's own entry: a dynamically added config
    store = AutotuneStore(Hostile({"inductor.autotune": [BEST]}).team())
    with installed(store):
        best = _autotune_cache(tmp_path, meta).read_best(meta, listed)
    assert best is not None and best.kwargs["XBLOCK"] == 256 and best not in listed


def test_installed_restores_read_best_and_install_is_idempotent(inductor_state: None) -> None:
    from torch._inductor.runtime.autotune_cache import AutotuneCache

    original = AutotuneCache.__dict__["read_best"]
    store = AutotuneStore(None)
    with installed(store):
        guarded = AutotuneCache.__dict__["read_best"]
        assert guarded is not original and getattr(guarded, autotune._GUARD) is original
        autotune.install_guard()
        assert AutotuneCache.__dict__["read_best"] is guarded  # not wrapped twice
        with installed(store):
            pass
        assert AutotuneCache.__dict__["read_best"] is guarded
    assert AutotuneCache.__dict__["read_best"] is original


@pytest.mark.parametrize(
    "replacement",
    [None, lambda self, configs: None, lambda self, inductor_meta: None],
    ids=["absent", "other-signature", "fewer-arguments"],
)
def test_a_torch_without_that_read_best_is_left_unguarded(
    inductor_state: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    replacement: Callable[..., Any] | None,
) -> None:
    from torch._inductor.runtime.autotune_cache import AutotuneCache

    if replacement is None:
        monkeypatch.delattr(AutotuneCache, "read_best")
    else:
        monkeypatch.setattr(AutotuneCache, "read_best", replacement)
    with caplog.at_level("DEBUG", logger=autotune.__name__), installed(AutotuneStore(None)):
        assert AutotuneCache.__dict__.get("read_best") is replacement
    assert "not guarded" in caplog.text


# -- real Inductor: a served group naming other choices changes nothing ----------------------------
MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc = nn.Linear(64, 128)

        def forward(self, x):
            return self.fc(x)


    def get_init_inputs():
        return []


    def get_inputs():
        return [torch.randn(32, 64, generator=torch.Generator().manual_seed(1))]
    """
)
FOREIGN = "NoSuchChoice-0000"


def _compile(model: Path, cache_dir: Path, out: Path, url: str | None) -> subprocess.Popen[str]:
    args = ["compile", str(model), str(out), *(["--url", url] if url is not None else [])]
    return inductor_runs.start(args, cache_dir)


@pytest.mark.slow
def test_inductor_picks_only_among_its_own_choices(server: LiveServer, tmp_path: Path) -> None:
    import torch

    from tunecache.inductor.choices import merge_groups, read_groups
    from tunecache.inductor.partition import partition

    model = tmp_path / "linear.py"
    model.write_text(MODEL)
    first = inductor_runs.report(_compile(model, tmp_path / "a", tmp_path / "a.pt", None))
    assert first["benchmarks"] > 0
    (choice_file,) = (tmp_path / "a" / "cache").iterdir()
    (group,) = read_groups(choice_file)
    own = sorted(group.timings)
    assert len(own) >= 2  # the MKL kernel and the C++ template
    slowest = max(own, key=lambda h: group.timings[h])
    # Served through the real server: every own choice timed (the slowest made "fastest") and a
    # choice Inductor does not have, faster still.
    complete = {**group.to_value(), "timings": {**{h: 1.0 for h in own}, slowest: 0.001,
                                                  FOREIGN: 0.0}}  # fmt: skip
    item = ArtifactIn(namespace="inductor.choices", partition=partition(), key="g", value=complete)
    with Client(server.url) as client:
        assert client.put_artifacts([item]).stored == 1
    # Merged straight into another process's file: one own choice missing, the foreign one there.
    partial = ChoiceGroup.from_value({**complete, "timings": {own[0]: 0.001, FOREIGN: 0.0}})
    assert partial is not None
    system = json.loads(choice_file.read_text())["system"]
    assert merge_groups(tmp_path / "c" / "cache" / choice_file.name, [partial], system) == 1
    served = _compile(model, tmp_path / "b", tmp_path / "b.pt", server.url)
    lacking = _compile(model, tmp_path / "c", tmp_path / "c.pt", None)
    served_report, lacking_report = inductor_runs.report(served), inductor_runs.report(lacking)
    # Every own choice has a time: Inductor takes the group, without benchmarking, and picks the
    # fastest of its own choices; the foreign choice is never looked at.
    assert served_report["enabled"]["merged"] == 1
    assert served_report["benchmarks"] == 0
    assert served_report["chosen"] == [slowest]
    # One own choice lacks a time: the group is not used at all; Inductor benchmarks.
    assert lacking_report["benchmarks"] > 0
    assert FOREIGN not in lacking_report["chosen"] and lacking_report["chosen"][0] in own
    expected = torch.load(tmp_path / "a.pt")
    for name in ("b.pt", "c.pt"):
        assert torch.allclose(torch.load(tmp_path / name), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_served_failed_choices_are_dropped_and_inductor_benchmarks_them(
    server: LiveServer, tmp_path: Path
) -> None:
    """The reviewer's attack: every own choice served as failed (``null``), plus a foreign one
    with a time so the schema admits the group. Merged as served, Inductor's next compile raised
    ``NoValidChoicesError``, and so did every later one on that cache, tunecache or not."""
    import torch

    from tunecache.inductor.choices import read_groups
    from tunecache.inductor.partition import partition

    model = tmp_path / "linear.py"
    model.write_text(MODEL)
    inductor_runs.report(_compile(model, tmp_path / "a", tmp_path / "a.pt", None))
    (choice_file,) = (tmp_path / "a" / "cache").iterdir()
    (group,) = read_groups(choice_file)
    own = sorted(group.timings)
    failed = {**group.to_value(), "timings": {**{h: None for h in own}, FOREIGN: 0.001}}
    item = ArtifactIn(namespace="inductor.choices", partition=partition(), key="g", value=failed)
    with Client(server.url) as client:
        assert client.put_artifacts([item]).stored == 1  # the schema cannot tell whose hash it is
    served = inductor_runs.report(_compile(model, tmp_path / "b", tmp_path / "b.pt", server.url))
    # Only "FOREIGN was timed at 0.001 ms" is merged: Inductor lacks its own choices' times and
    # benchmarks them itself; it picks one of its own.
    assert served["enabled"]["merged"] == 1
    assert served["benchmarks"] > 0 and served["chosen"][0] in own
    (merged,) = read_groups(tmp_path / "b" / "cache" / choice_file.name)
    assert all(math.isfinite(merged.timings[h]) for h in own)
    # A later process on that cache, without tunecache, uses the times Inductor measured.
    later = inductor_runs.report(_compile(model, tmp_path / "b", tmp_path / "c.pt", None))
    assert later["benchmarks"] == 0 and later["chosen"] == served["chosen"]
    expected = torch.load(tmp_path / "a.pt")
    for name in ("b.pt", "c.pt"):
        assert torch.allclose(torch.load(tmp_path / name), expected, rtol=1e-4, atol=1e-5)
