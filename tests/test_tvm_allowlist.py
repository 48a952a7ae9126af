"""A TVM record is data, not code: the allowlist of MetaSchedule trace instructions.

A trace may ``Annotate`` a loop with ``pragma_import_llvm``: TVM's LLVM codegen links the IR it
carries into the kernel, and a definition of ``erff`` there replaces the libm call of any kernel
computing ``erf`` (the built-in ``bias_gelu``). Here that IR calls ``system()`` to create a marker
file. The record is refused by the closed schema (:mod:`tunecache.configcheck.tvm`) everywhere a
trace can enter: the server's upload, a record written straight into the server's database and
served to a fresh process, a hostile server at the client's transport, a built-in TVM config given
to the backend. Without the check, TVM's own replay and build of the same record runs the command
(shown in a subprocess), so the tests are not vacuous. MetaSchedule's own traces of the built-in
workloads and of users' kernels, on llvm and CUDA targets, all pass.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import LiveServer
from tests.factories import builtin_problems, hostile_artifacts, miss, store_behind_the_api
from tunecache.configcheck import artifact_problem
from tunecache.configcheck import config_problem as any_config_problem
from tunecache.configcheck.tvm import config_problem, record_value_problem, workload_value_problem
from tunecache.configcheck.tvm_trace import trace_problem
from tunecache.errors import InvalidInput

REPO = Path(__file__).resolve().parent.parent
CLIENT_SCRIPT = REPO / "tests" / "tvm_db_client.py"

# A real llvm trace of MetaSchedule (matmul, after postprocs), shortened: the base of the
# hand-made hostile traces below.
BASE_TRACE: list[Any] = [
    [
        ["GetSBlock", [], ["C", "main"], ["b0"]],
        ["GetSBlock", [], ["root", "main"], ["b1"]],
        ["Annotate", ["b0", '"SSRSRS"'], ["meta_schedule.tiling_structure"], []],
        ["GetLoops", ["b0"], [], ["l2", "l3", "l4"]],
        ["SamplePerfectTile", ["l2"], [4, 64], ["v5", "v6", "v7", "v8"]],
        ["Split", ["l2", "v5", "v6", "v7", "v8"], [True, False], ["l9", "l10", "l11", "l12"]],
        ["Reorder", ["l9", "l10", "l3", "l11", "l12", "l4"], [], []],
        ["CacheWrite", ["b0", []], [0, "global"], ["b13"]],
        ["ReverseComputeAt", ["b13", "l10"], [1, -1], []],
        ["SampleCategorical", [], [[0, 16, 64, 512], [0.25, 0.25, 0.25, 0.25]], ["v14"]],
        ["Annotate", ["b1", "v14"], ["meta_schedule.unroll_explicit"], []],
        ["Annotate", ["b1", 32], ["meta_schedule.parallel"], []],
        ["EnterPostproc", [], [], []],
        ["Parallel", ["l9"], [], []],
        ["Annotate", ["l9", 64], ["pragma_auto_unroll_max_step"], []],
        ["Split", ["l12", "None", 1], [True, False], ["l15", "l16"]],
        ["Bind", ["l15"], ["threadIdx.x"], []],
        ["Annotate", ["l15", [0, 0, 2]], ["software_pipeline_stage"], []],
    ],
    [[4, [2, 1, 16, 4]], [9, 1]],
]
# The same without the GPU's instructions (a Bind to a thread axis, a software pipeline): a trace
# for a CPU (llvm), as every built-in TVM record is.
CPU_TRACE = [BASE_TRACE[0][:-3], BASE_TRACE[1]]
IR_PLACEHOLDER = '"define float @erff(float %x) { ret float %x }"'


def _with(index: int, inst: list[Any]) -> list[Any]:
    trace = copy.deepcopy(BASE_TRACE)
    trace[0][index] = inst
    return trace


HOSTILE: list[tuple[str, list[Any], str]] = [
    ("pragma_import_llvm",
     _with(14, ["Annotate", ["l9", IR_PLACEHOLDER], ["pragma_import_llvm"], []]),
     "trace[0][14] (Annotate): annotation key 'pragma_import_llvm' is not allowed"),
    ("pragma_import_c", _with(14, ["Annotate", ["l9", '"int x;"'], ["pragma_import_c"], []]),
     "annotation key 'pragma_import_c' is not allowed"),
    ("split without its bounds check",
     _with(15, ["Split", ["l12", "None", 3], [True, True], ["l15", "l16"]]),
     "trace[0][15] (Split): attributes item 1: disable_predication must be off, not True"),
    ("unknown kind", _with(13, ["RunShell", ["l9"], ["touch x"], []]),
     "trace[0][13]: instruction kind 'RunShell' is not allowed"),
    ("transform layout", _with(13, ["TransformLayout", ["b0", '{"root_index": 1}'], [0, 0], []]),
     "instruction kind 'TransformLayout' is not allowed"),
    ("tensorize", _with(13, ["Tensorize", ["b0"], ["dot_16x4_vnni", 1], []]),
     "instruction kind 'Tensorize' is not allowed"),
    ("made-up thread axis", _with(16, ["Bind", ["l15"], ["threadIdx.w"], []]),
     "trace[0][16] (Bind): attributes item 0: thread axis 'threadIdx.w' is not allowed"),
    ("storage scope", _with(7, ["CacheWrite", ["b0", []], [0, "global.texture"], ["b13"]]),
     "(CacheWrite): attributes item 1: storage scope 'global.texture' is not allowed"),
    ("string for an RV", _with(13, ["Parallel", ['"l9"'], [], []]),
     "(Parallel): inputs item 0: '\"l9\"' is not a random variable's name"),
    ("string as an annotation value",
     _with(11, ["Annotate", ["b1", '"/tmp/evil.ll"'], ["meta_schedule.parallel"], []]),
     "the value of meta_schedule.parallel: '\"/tmp/evil.ll\"' is not an integer"),
    ("tiling structure", _with(2, ["Annotate", ["b0", '"SSR;x"'], ["meta_schedule.tiling_structure"],
                                   []]),
     "the value of meta_schedule.tiling_structure: '\"SSR;x\"' is not a quoted tiling"),
    ("unbounded unroll", _with(14, ["Annotate", ["l9", 2**30], ["pragma_auto_unroll_max_step"], []]),
     "is not an integer in 0..4096"),
    ("block name", _with(0, ["GetSBlock", [], ["C\n; rm", "main"], ["b0"]]),
     "(GetSBlock): attributes item 0: 'C\\n; rm' is not a block or function name"),
    ("decision of a non-sampling instruction", [BASE_TRACE[0], [[5, 3]]],
     "trace[1][0]: the decision for instruction 5: Split takes no decision"),
    ("zero tile", [BASE_TRACE[0], [[4, [2, 0, 16, 4]]]], "is not an integer in 1.."),
    ("categorical index", [BASE_TRACE[0], [[9, 4]]], "4 is not an integer in 0..3"),
    ("too long", [[["EnterPostproc", [], [], []]] * 5000, []], "5000 instructions, over 4096"),
    ("blocks without bound", [[["GetSBlock", [], ["C", "main"], ["b0"]]]
                              + [["CacheRead", ["b0", []], [0, "global"], [f"b{i}"]]
                                 for i in range(1, 130)], []],
     "trace adds 129 blocks (CacheRead, CacheWrite, RFactor, DecomposeReduction), over 128"),
    ("loops without bound", [[["GetSBlock", [], ["C", "main"], ["b0"]],
                              ["GetLoops", ["b0"], [], ["l0"]]]
                             + [["Split", [f"l{2 * i}", "None", 1], [True, False],
                                 [f"l{2 * i + 2}", f"l{2 * i + 3}"]] for i in range(257)], []],
     "trace adds 514 loops (Split, AddUnitLoop), over 512"),
    ("reorders without bound", [[["GetSBlock", [], ["C", "main"], ["b0"]],
                                 ["GetLoops", ["b0"], [], ["l1", "l2", "l3"]]]
                                + [["Reorder", ["l3", "l2", "l1"], [], []]] * 342, []],
     "trace reorders or fuses 1026 loops (Reorder, Fuse), over 1024"),
    ("sampling without its decision", [BASE_TRACE[0], [[4, [2, 1, 16, 4]]]],
     "trace[0][9] (SampleCategorical): a sampling instruction without its decision"),
    ("no decisions at all", [BASE_TRACE[0], []],
     "trace[0][4] (SamplePerfectTile): a sampling instruction without its decision"),
    ("storage align factor", _with(13, ["StorageAlign", ["b13"], [0, -2, 1048576, 8], []]),
     "trace[0][13] (StorageAlign): attributes item 2: 1048576 is not an integer in 1..128"),
    ("storage align factor not a power of two",
     _with(13, ["StorageAlign", ["b13"], [0, -2, 96, 8], []]), "factor 96 is not a power of two"),
    ("storage align offset", _with(13, ["StorageAlign", ["b13"], [0, -2, 32, 32], []]),
     "item 3: offset 32 is not in 0..31"),
    ("storage align negative offset", _with(13, ["StorageAlign", ["b13"], [0, -2, 32, -1], []]),
     "item 3: offset -1 is not in 0..31"),
    ("storage align innermost axis", _with(13, ["StorageAlign", ["b13"], [0, -1, 32, 8], []]),
     "attributes item 1: -1 is not an integer in -8..-2"),
    ("storage align positive axis", _with(13, ["StorageAlign", ["b13"], [0, 1, 32, 8], []]),
     "attributes item 1: 1 is not an integer in -8..-2"),
]  # fmt: skip

# The audit's: a tile sampled without its decision before an RFactor (a matmul's "C"): TVM
# sampled a fresh tile in each process, and ranks summed in their own orders.
UNDECIDED_RFACTOR: list[Any] = [
    [
        ["GetSBlock", [], ["C", "main"], ["b0"]],
        ["GetLoops", ["b0"], [], ["l1", "l2", "l3"]],
        ["SamplePerfectTile", ["l3"], [2, 64], ["v4", "v5"]],
        ["Split", ["l3", "v4", "v5"], [True, False], ["l6", "l7"]],
        ["RFactor", ["l6"], [0], ["b8"]],
    ],
    [],
]
# The audit's: a factor of 2**20 made the consumer's own build raise (an int32 overflow).
UNBOUNDED_ALIGN: list[Any] = [
    [
        ["GetSBlock", [], ["C", "main"], ["b0"]],
        ["CacheRead", ["b0", []], [0, "global"], ["b1"]],
        ["StorageAlign", ["b1"], [0, 1, 1048576, 1048575], []],
    ],
    [],
]


# -- the closed schema itself (no TVM) ----------------------------------------------------------
def test_the_base_trace_passes() -> None:
    assert trace_problem(BASE_TRACE, "cuda") is None
    assert trace_problem(CPU_TRACE) is None  # a CPU's, by default


GPU_ONLY: list[tuple[str, list[Any], str]] = [
    ("bind", ["Bind", ["l9"], ["threadIdx.x"], []], "instruction kind Bind is for a GPU"),
    ("pipeline", ["Annotate", ["l9", [0, 0, 2]], ["software_pipeline_stage"], []],
     "annotation key 'software_pipeline_stage' is for a GPU"),
    ("cooperative fetch", ["Annotate", ["b1", 2], ["meta_schedule.cooperative_fetch"], []],
     "annotation key 'meta_schedule.cooperative_fetch' is for a GPU"),
    ("shared memory", ["CacheWrite", ["b0", []], [0, "shared"], ["b13"]],
     "storage scope 'shared' is for a GPU"),
    # MetaSchedule's own padding of shared memory (its tensor-core rule; the cooperative-fetch
    # postproc of TVM 0.1x): CUDA only.
    ("storage align", ["StorageAlign", ["b13"], [0, -2, 32, 8], []],
     "instruction kind StorageAlign is for a GPU"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "inst", "message"), GPU_ONLY, ids=[g[0] for g in GPU_ONLY])
def test_a_cpu_trace_holds_nothing_of_a_gpu(case: str, inst: list[Any], message: str) -> None:
    """TVM replays these on an llvm target, then its build fails or raises: a CPU's trace (and
    every built-in TVM record) refuses them; a CUDA trace takes them."""
    index = 7 if inst[0] == "CacheWrite" else 13
    trace = [[*CPU_TRACE[0][:index], inst, *CPU_TRACE[0][index + 1 :]], CPU_TRACE[1]]
    why = trace_problem(trace)
    assert why is not None and message in why, why
    assert trace_problem(trace, "cuda") is None
    record = [trace, [1e-6], {"kind": "llvm"}, [["TENSOR", "float32", [8]]]]
    assert record_value_problem(record) == why  # the device of the target the record names
    assert record_value_problem([trace, [1e-6], {"kind": "cuda"}, record[3]]) is None
    assert record_value_problem([trace, [1e-6], {"kind": "cuda"}, record[3]], "cpu") == why
    config = {"schedule": "meta_schedule", "trace": trace, "target": {"kind": "cuda"}}
    assert any_config_problem("tvm", config) == why  # a TVM record builds for the host CPU
    assert any_config_problem("tvm", config, device="cuda") is None


def test_unroll_is_refused_everywhere() -> None:
    """A served Unroll of a large fused loop made a build run for minutes; MetaSchedule unrolls
    through bounded annotations instead."""
    trace = _with(13, ["Unroll", ["l9"], [], []])
    for device in ("cpu", "cuda"):
        why = trace_problem(trace, device)
        assert why is not None and "instruction kind 'Unroll' is not allowed" in why


def test_a_sampling_instruction_without_its_decision_is_refused() -> None:
    """MetaSchedule records every decision; without one, each process reading the record would
    sample its own tile (the audit's RFactor: results differed bit for bit across ranks)."""
    for device in ("cpu", "cuda"):
        why = trace_problem(UNDECIDED_RFACTOR, device)
        assert why == ("trace[0][2] (SamplePerfectTile): a sampling instruction without its "
                       "decision (each process would sample its own)"), why  # fmt: skip
    decided = [UNDECIDED_RFACTOR[0], [[2, [2, 32]]]]
    assert trace_problem(decided) is None
    record = [UNDECIDED_RFACTOR, [1e-6], {"kind": "llvm"}, [["TENSOR", "float32", [8]]]]
    assert record_value_problem(record) == trace_problem(UNDECIDED_RFACTOR)


def test_an_unbounded_storage_align_is_refused() -> None:
    """The audit's alignment of a cache buffer by 2**20 made the consumer's build overflow int32:
    refused on a CPU (MetaSchedule aligns only a GPU's shared memory) and on a GPU (a factor
    over 128, an axis that may be the innermost); MetaSchedule's own (0, -2, 32, 8 or 16)
    passes on a GPU."""
    why = trace_problem(UNBOUNDED_ALIGN)
    assert why is not None and why.startswith("trace[0][2] (StorageAlign): "), why
    why = trace_problem(UNBOUNDED_ALIGN, "cuda")
    assert why == ("trace[0][2] (StorageAlign): attributes item 1: 1 is not an integer in "
                   "-8..-2"), why  # fmt: skip
    for offset in (8, 16):
        honest = copy.deepcopy(UNBOUNDED_ALIGN)
        honest[0][2][2] = [0, -2, 32, offset]
        assert trace_problem(honest, "cuda") is None
        assert "StorageAlign is for a GPU" in str(trace_problem(honest))


@pytest.mark.parametrize(("case", "trace", "message"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_traces_are_refused_naming_the_reason(
    case: str, trace: list[Any], message: str
) -> None:
    why = trace_problem(trace, "cuda")
    assert why is not None and message in why, why
    config = {"schedule": "meta_schedule", "trace": trace, "target": {"kind": "cuda"}}
    assert config_problem(config, "cuda") == why
    assert any_config_problem("tvm", config, device="cuda") == why
    record = [trace, [1e-6], {"kind": "cuda"}, [["TENSOR", "float32", [8]]]]
    assert record_value_problem(record) == why
    assert artifact_problem("tvm.record", record) == why


CONFIGS_OK: list[Any] = [
    {"schedule": "default"},
    {"schedule": "knobs", "tile_i": 8, "tile_j": 32, "tile_k": 16, "vectorize": True,
     "parallel": True, "unroll": 16},
    {"schedule": "meta_schedule", "trace": CPU_TRACE,
     "target": {"kind": "llvm", "tag": "", "keys": ["cpu"], "num-cores": 2, "mcpu": "znver5"}},
    {"schedule": "meta_schedule", "trace": CPU_TRACE,
     "target": {"kind": "cuda", "arch": "sm_90a", "max_num_threads": 1024,
                "host": {"kind": "llvm", "mtriple": "x86_64-linux-gnu"}}},
]  # fmt: skip
CONFIGS_BAD: list[tuple[Any, str]] = [
    ({"schedule": "default", "trace": []}, "'trace' is not a field of a default config"),
    ({"schedule": "autotvm"}, "schedule='autotvm' is not one of default, knobs, meta_schedule"),
    ({"schedule": "knobs", "tile_i": "8"}, "knob tile_i='8' is not a flag or an integer"),
    ({"schedule": "knobs", "tile_i": 8.0}, "knob tile_i=8.0 is not a flag or an integer"),
    ({"schedule": "knobs", "unroll": 2**40}, "is not a flag or an integer in 0..4096"),
    ({"schedule": "knobs", "os.system": 1}, "'os.system' is not a knob name"),
    ({"schedule": "knobs", **{f"k{i}": 1 for i in range(17)}}, "17 knobs, over 16"),
    ({"schedule": "meta_schedule"}, "a meta_schedule config needs a trace"),
    ({"schedule": "meta_schedule", "trace": CPU_TRACE, "code": "x"},
     "'code' is not a field of a meta_schedule config"),
    ({"schedule": "meta_schedule", "trace": CPU_TRACE, "target": "llvm -mcpu=x"},
     "is not an object"),
    ({"schedule": "meta_schedule", "trace": CPU_TRACE,
      "target": {"kind": "llvm", "cl-opt": ["-load=/tmp/evil.so"]}},
     "target field 'cl-opt' is not allowed"),
    ({"schedule": "meta_schedule", "trace": CPU_TRACE, "target": {"kind": "llvm", "x": {"a": 1}}},
     "target field x={'a': 1} is not a plain bounded value"),
    ({"schedule": "meta_schedule", "trace": CPU_TRACE, "target": {"kind": "llvm", "x": "y" * 300}},
     "is not a plain bounded value"),
    ([1, 2], "[1, 2] is not an object"),
]  # fmt: skip


@pytest.mark.parametrize("config", CONFIGS_OK)
def test_tvm_configs_of_every_schedule_kind_pass(config: Any) -> None:
    assert config_problem(config) is None
    assert any_config_problem("tvm", config) is None


@pytest.mark.parametrize(("config", "message"), CONFIGS_BAD)
def test_malformed_tvm_configs_are_refused(config: Any, message: str) -> None:
    why = config_problem(config)
    assert why is not None and message in why, why


def test_workload_values_are_a_sha_and_an_object() -> None:
    sha = "ab" * 32
    assert workload_value_problem({"script_sha": sha, "mod": {"root": 1, "nodes": []}}) is None
    assert artifact_problem("tvm.workload", {"script_sha": sha, "mod": {}}) is None
    bad = [
        ({"script_sha": sha.upper(), "mod": {}}, "is not 64 hex digits"),
        ({"script_sha": sha, "mod": "import os"}, "mod is not an object"),
        ({"script_sha": sha, "mod": {}, "code": 1}, "not a {script_sha, mod} object"),
        ([sha, {}], "not a {script_sha, mod} object"),
    ]
    for value, message in bad:
        why = workload_value_problem(value)
        assert why is not None and message in why, why


def test_record_values_keep_the_shape_checks() -> None:
    args = [["TENSOR", "float32", [8]]]
    assert record_value_problem([CPU_TRACE, [1e-6], None, args]) is None
    bad = [
        ({"garbage": True}, "not a [trace, run_secs, target, args_info] list"),
        ([CPU_TRACE, ["fast"], None, args], "run times are missing, failed or not numbers"),
        ([CPU_TRACE, [1e10], None, args], "run times are missing, failed or not numbers"),
        ([CPU_TRACE, [1e-6], {"kind": 7}, args], "target kind 7 is not a name"),
        ([CPU_TRACE, [1e-6], None, "args"], "argument info is not a list"),
        ([CPU_TRACE, [1e-6], None, [["TENSOR", {"x": 1}]]], "args_info[0] is not a list"),
        ([CPU_TRACE, [2**64], None, args], "an integer TVM cannot take"),
        ([[CPU_TRACE[0], [[10_000, [4, 16]]]], [1e-6], None, args], "not one of the trace's"),
    ]
    for value, message in bad:
        why = record_value_problem(value)
        assert why is not None and message in why, why


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(data=st.data(), replacement=JSON)
def test_the_checks_never_raise(data: st.DataObject, replacement: Any) -> None:
    """Any JSON, or a real trace with any part replaced by any JSON: a reason or None."""
    trace = copy.deepcopy(BASE_TRACE)
    index = data.draw(st.integers(0, len(trace[0]) - 1))
    part = data.draw(st.integers(0, 3))
    trace[0][index][part] = replacement
    values = [replacement, trace, [trace, [1e-6], replacement, []], [trace, [1e-6], None,
              replacement], {"schedule": "meta_schedule", "trace": trace},
              {"schedule": "knobs", "x": replacement}, {"schedule": replacement}]  # fmt: skip
    for value in values:
        for check in (trace_problem, config_problem, record_value_problem,
                      workload_value_problem):  # fmt: skip
            why = check(value)
            assert why is None or isinstance(why, str)


def test_the_schema_imports_no_tvm() -> None:
    code = (
        "import sys, tunecache.configcheck.tvm, tunecache.configcheck.tvm_trace, tunecache.configcheck;"
        "assert 'tvm' not in sys.modules, 'tvm imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=REPO)


def test_a_records_summary_imports_no_tvm() -> None:
    """``tunecache get`` of a MetaSchedule record took 4-6 s more, silent, importing TVM to
    summarise its trace (backends.tvm.schedule imported tunecache.tvm, which imports TVM)."""
    config = {"schedule": "meta_schedule", "trace": CPU_TRACE}
    code = (
        "import sys, json; from tunecache_cli.trials import config_text;"
        f"text = config_text('tvm', json.loads({json.dumps(config)!r}), 80);"
        "assert text == 'tiles 2x1x16x4 unroll 16 par', text;"
        "assert 'tvm' not in sys.modules, 'tvm imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=REPO)


# -- MetaSchedule's own traces pass ---------------------------------------------------------------
tvm = pytest.importorskip("tvm")

from tests.test_tvm_database import KERNELS  # noqa: E402
from tunecache.tvm import Database, partition_for, workload_key  # noqa: E402
from tunecache.tvm.target import host_target  # noqa: E402

# The user kernels of tests/test_tvm_database.py, and one computing erf (the payload's target).
USER_KERNELS = (
    KERNELS
    + """

@T.prim_func(s_tir=True)
def erf16(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    T.func_attr({"tirx.noalias": True})
    for i in range(16):
        with T.sblock("B"):
            vi = T.axis.remap("S", [i])
            B[vi] = T.erf(A[vi])
"""
)
BUILTIN_PROBLEMS = builtin_problems({"M": 64, "N": 48, "K": 32}, {"M": 16, "N": 200},
                                    bias_gelu={"M": 32, "N": 48, "K": 32})  # fmt: skip


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("user") / "user_kernels.py"
    path.write_text(USER_KERNELS)
    return path


def _load(path: Path, name: str) -> Any:
    import runpy

    value = runpy.run_path(str(path))[name]
    return value() if callable(value) and not isinstance(value, tvm.tirx.PrimFunc) else value


def _normalized(func: Any) -> Any:
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    return _normalize_mod(func)


def _modules(kernels: Path) -> dict[str, Any]:
    from tvm import te

    from workloads import get_workload

    mods = {
        name: tvm.IRModule({"main": te.create_prim_func(
            get_workload(name).tvm_compute(problem, "float32"))})
        for name, problem in BUILTIN_PROBLEMS.items()
    }  # fmt: skip
    for name in ("matmul_bias", "scale_add", "erf16"):
        mods[name] = _normalized(_load(kernels, name))
    return mods


def _space_traces(mod: Any, target: Any, seeds: int) -> list[Any]:
    """MetaSchedule's design spaces of ``mod``, and ``seeds`` samples of each after postprocs.

    CUDA gets MetaSchedule's ``cuda`` rules and postprocs by name: for float32 they give the same
    traces as the target's own (which add tensor-core rules, for float16 only) without importing
    TVM's CUDA tensor intrinsics (7 to 20 s).
    """
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.schedule import Trace

    from backends.tvm.schedule import trace_json

    space: Any = "post-order-apply"
    if target.kind.name == "cuda":
        space = ms.space_generator.PostOrderApply(sch_rules="cuda", postprocs="cuda",
                                                  mutator_probs="cuda")  # fmt: skip
    ctx = ms.TuneContext(mod=mod, target=target, space_generator=space,
                         search_strategy="evolutionary", task_name="allowlist")  # fmt: skip
    traces = []
    for design in ctx.space_generator.generate_design_space(mod):
        traces.append(trace_json(design.trace))
        for seed in range(1, seeds + 1):
            sch = tvm.s_tir.Schedule(mod, seed=seed)
            try:  # new decisions, sampled with this seed
                Trace(design.trace.insts, {}).apply_to_schedule(sch, remove_postproc=True)
            except Exception:  # a sample that does not fit: MetaSchedule drops it too
                continue
            sch.enter_postproc()
            if all(postproc.apply(sch) for postproc in ctx.space_generator.postprocs):
                traces.append(trace_json(sch.trace))
    return traces


# What each target's traces must have exercised (so the test covers those parts of the allowlist).
EXERCISED = {
    "llvm": {"Parallel", "Vectorize", "RFactor", "DecomposeReduction", "EnterPostproc",
             "pragma_auto_unroll_max_step", "meta_schedule.tiling_structure"},
    "nvidia/nvidia-h100": {"Bind", "CacheRead", "SetScope", "meta_schedule.cooperative_fetch",
                           "software_pipeline_stage", "meta_schedule.thread_extent_low_inclusive"},
}  # fmt: skip


@pytest.mark.parametrize("target", ["llvm", "nvidia/nvidia-h100"])
def test_metaschedule_design_spaces_pass(target: str, kernels: Path) -> None:
    from tvm.target import Target

    from backends.tvm.intrin import cpu_intrinsics_only

    tvm_target = Target(host_target() if target == "llvm" else target)
    seen: set[str] = set()
    with cpu_intrinsics_only():
        for name, mod in _modules(kernels).items():
            traces = _space_traces(mod, tvm_target, seeds=8)
            assert len(traces) >= 2, name
            for trace in traces:
                why = trace_problem(trace, "cpu" if target == "llvm" else "cuda")
                assert why is None, f"{name} on {target}: {why}"
                seen.update(i[2][0] if i[0] == "Annotate" else i[0] for i in trace[0])
    assert EXERCISED[target] <= seen


@pytest.mark.slow
def test_a_real_search_gives_configs_that_pass_and_build(tmp_path: Path) -> None:
    from backends import Budget, SearchRequest
    from backends.tvm import TVMBackend
    from workloads import get_workload

    backend = TVMBackend()
    workload, problem = get_workload("bias_gelu"), {"M": 16, "N": 32, "K": 32}
    result = backend.search(SearchRequest(workload, problem, "float32", Budget(trials=8)),
                            workdir=tmp_path)  # fmt: skip
    configs = [t.config for t in result.trials]
    assert len(configs) >= 4
    for config in configs:
        assert config_problem(config) is None
    inputs = workload.make_inputs(problem, "float32", 1)
    out = backend.build(workload, problem, "float32", result.config)(*inputs)
    ref = workload.reference(*inputs)
    assert float((out.double() - ref).norm() / ref.norm()) <= workload.tolerance("float32")


# -- the exploit: a record whose LLVM IR runs a shell command --------------------------------------
def _evil_ir(marker: Path) -> str:
    """LLVM IR defining ``erff`` (which a kernel computing ``erf`` calls) to run ``touch``."""
    command = f"touch {marker}"
    assert '"' not in command and "\\" not in command
    return (
        f'@tc_cmd = internal constant [{len(command) + 1} x i8] c"{command}\\00"\n'
        "declare i32 @system(ptr)\n"
        "define float @erff(float %x) {\n"
        "  %r = call i32 @system(ptr @tc_cmd)\n"
        "  ret float %x\n"
        "}\n"
    )


def _evil_schedule(mod: Any, marker: Path, block: str = "B") -> Any:
    """A valid schedule of ``mod`` (split, parallel) whose innermost loop imports the evil IR."""
    sch = tvm.s_tir.Schedule(mod)
    loops = sch.get_loops(sch.get_sblock(block))
    outer, inner = sch.split(loops[0], [None, 4])
    sch.parallel(outer)
    sch.annotate(inner, "pragma_import_llvm", _evil_ir(marker))
    return sch


def _evil_record(mod: Any, marker: Path) -> list[Any]:
    """The ``tvm.record`` value of the evil schedule of ``mod``, measured at a tiny time."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    from tunecache.tvm.jsonutil import plain_json

    record = TuningRecord(_evil_schedule(mod, marker).trace, Workload(mod), [1e-7],
                          tvm.target.Target(host_target()),
                          ArgInfo.from_entry_func(mod, remove_preproc=True))  # fmt: skip
    value: list[Any] = json.loads(json.dumps(plain_json(record.as_json())))
    return value


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **extra}


# Runs, in a fresh process, what compile_tir does with a record once it is accepted (TVM's own
# parse and replay, then a build and a call): the record without tunecache's check.
UNCHECKED = """
import json, runpy, sys
import numpy as np, tvm
from tvm.s_tir.meta_schedule.database import TuningRecord, Workload
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod
mod = _normalize_mod(runpy.run_path(sys.argv[1])["erf16"])
record = TuningRecord.from_json(json.load(open(sys.argv[2])), Workload(mod))
sch = tvm.s_tir.Schedule(mod)
record.trace.apply_to_schedule(sch, remove_postproc=False)
lib = tvm.tirx.build(sch.mod, target=tvm.target.Target(json.loads(sys.argv[3])))
x = tvm.runtime.tensor(np.full(16, 0.5, "float32"))
y = tvm.runtime.tensor(np.zeros(16, "float32"))
lib["main"](x, y)
"""


def test_the_code_bearing_record_is_refused_naming_the_key(kernels: Path, tmp_path: Path) -> None:
    mod = _normalized(_load(kernels, "erf16"))
    value = _evil_record(mod, tmp_path / "marker")
    for why in (record_value_problem(value), trace_problem(value[0]),
                artifact_problem("tvm.record", value)):  # fmt: skip
        assert why == "trace[0][4] (Annotate): annotation key 'pragma_import_llvm' is not allowed"
    clean = copy.deepcopy(value)
    del clean[0][0][4]  # the same record without the annotation
    assert record_value_problem(clean) is None


def _write_row(server: LiveServer, key: str, value: Any, score: float) -> None:
    """Stores ``value`` as a ``tvm.record`` item straight into the server's database, as a
    hostile admin (or a bug, or an old server) could: no API, no check."""
    item = {"namespace": "tvm.record", "partition": partition_for(host_target()), "key": key,
            "item": "evil", "value": value, "score": score}  # fmt: skip
    assert store_behind_the_api(server.db, [item]) == 1


@pytest.mark.slow
def test_a_code_bearing_record_in_the_database_runs_no_code(
    server: LiveServer, kernels: Path, tmp_path: Path
) -> None:
    from tunecache.client import Client

    marker = tmp_path / "marker"
    mod = _normalized(_load(kernels, "erf16"))
    key = workload_key(mod)
    value = _evil_record(mod, marker)
    _write_row(server, key, value, score=1e-7)
    with Client(server.url) as client:  # behind the API; its read checks the schema again
        assert client.get_artifacts("tvm.record", partition_for(host_target()), key=key) == []

    # A compromised server serves it, as the best record of the key, to a fresh process.
    with hostile_artifacts([value]) as url:
        for where in (server.url, url):
            out = tmp_path / ("real" if where == server.url else "hostile")
            out.mkdir()
            done = subprocess.run(
                [sys.executable, str(CLIENT_SCRIPT), where, str(kernels), "erf16", str(out)],
                capture_output=True, text=True, timeout=120, cwd=out,
                env=_env(XDG_CACHE_HOME=str(out / "cache")),
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert not marker.exists()
            result = json.loads((out / "result.json").read_text())
            assert result["schedule"] == "default" and result["benchmarks"] == {}
    ours = [line for line in done.stderr.splitlines() if "tunecache.tvm" in line]
    assert len(ours) == 1 and "ignoring record #" in ours[0], done.stderr
    assert "annotation key 'pragma_import_llvm' is not allowed" in ours[0]

    # Not vacuous: TVM's own replay and build of that value run the command.
    (tmp_path / "served.json").write_text(json.dumps(value))
    unchecked = subprocess.run(
        [sys.executable, "-c", UNCHECKED, str(kernels), str(tmp_path / "served.json"),
         json.dumps(host_target())],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_env(),
    )  # fmt: skip
    assert marker.exists(), unchecked.stderr[-2000:]


@pytest.mark.slow
def test_a_write_token_cannot_upload_it(server: LiveServer, kernels: Path, tmp_path: Path) -> None:
    from tunecache.client import Client

    mod = _normalized(_load(kernels, "erf16"))
    with Client(server.url) as admin:
        writer = admin.create_token("writer", "write").token
    partition, key = partition_for(host_target()), workload_key(mod)
    item = {"namespace": "tvm.record", "partition": partition, "key": key, "item": "evil",
            "score": 1e-7, "value": _evil_record(mod, tmp_path / "marker")}  # fmt: skip
    answer = httpx.post(f"{server.url}/v1/artifacts", json={"items": [item]},
                        headers={"Authorization": f"Bearer {writer}"}, timeout=30)  # fmt: skip
    assert answer.status_code == 422, answer.text
    assert "pragma_import_llvm" in answer.text
    with Client(server.url) as client:
        assert client.get_artifacts("tvm.record", partition, key=key) == []


def _hostile_transport(value: Any, key: str) -> Callable[[httpx.Request], httpx.Response]:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/artifacts":
            return miss()
        item = {"namespace": "tvm.record", "partition": partition_for(host_target()),
                "key": key, "item": "evil", "value": value, "score": 1e-7, "id": 1,
                "updated_at": "2026-01-01T00:00:00Z"}  # fmt: skip
        return httpx.Response(200, json={"items": [item], "next_after": None})

    return handle


def test_a_hostile_server_serving_it_is_refused(
    kernels: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import numpy as np
    from tvm.s_tir.meta_schedule import tir_integration

    from tunecache.client import Client

    caplog.set_level(logging.WARNING)
    marker = tmp_path / "marker"
    mod = _normalized(_load(kernels, "erf16"))
    url = "http://hostile.invalid"
    db = Database(url, target=host_target())
    db.remote.client.close()
    db.remote.client = Client(url, transport=httpx.MockTransport(
        _hostile_transport(_evil_record(mod, marker), workload_key(mod))))  # fmt: skip
    assert tir_integration.compile_tir(db, mod, host_target()) is None  # TVM's default schedule
    assert db.get_all_tuning_records() == []
    lib = tvm.tirx.build(mod, target=tvm.target.Target(host_target()))
    x = tvm.runtime.tensor(np.full(16, 0.5, "float32"))
    y = tvm.runtime.tensor(np.zeros(16, "float32"))
    lib["main"](x, y)
    assert not marker.exists()
    np.testing.assert_allclose(y.numpy(), 0.5204999, rtol=1e-5)  # erf(0.5), not the fake
    warnings = [r.getMessage() for r in caplog.records
                if r.name.startswith("tunecache") and r.levelno >= logging.WARNING]  # fmt: skip
    assert len(warnings) == 1 and "pragma_import_llvm" in warnings[0], warnings


def test_a_builtin_config_carrying_it_is_refused_before_compiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tvm import te

    import backends.tvm.runnable
    from backends.tvm import TVMBackend
    from backends.tvm.schedule import trace_json
    from workloads import get_workload

    compiled: list[Any] = []
    monkeypatch.setattr(backends.tvm.runnable, "compile_module",
                        lambda *args, **kwargs: compiled.append(args))  # fmt: skip
    marker = tmp_path / "marker"
    workload, problem = get_workload("bias_gelu"), {"M": 8, "N": 16, "K": 8}
    mod = tvm.IRModule({"main": te.create_prim_func(workload.tvm_compute(problem, "float32"))})
    config = {"schedule": "meta_schedule", "target": host_target(),
              "trace": trace_json(_evil_schedule(mod, marker, block="Y").trace)}  # fmt: skip
    assert "pragma_import_llvm" in (any_config_problem("tvm", config) or "")
    with pytest.raises(InvalidInput, match="annotation key 'pragma_import_llvm' is not allowed"):
        TVMBackend().build(workload, problem, "float32", config)
    assert compiled == [] and not marker.exists()
