"""The closed schema of a MetaSchedule trace: scheduling decisions, never code.

A MetaSchedule trace is a program: replayed on a module, its instructions rewrite the module, and
some rewrites carry code. ``Annotate(loop, "pragma_import_llvm", "<LLVM IR>")`` makes TVM's LLVM
codegen parse that IR (or read the ``.ll``/``.bc`` file it names) and link it into the kernel: a
definition of a function the kernel calls (``erff``, when it computes ``erf``) replaces it, and a
served record ran ``system()`` inside the consuming process that way. So a trace that may be
served (:func:`trace_problem`) holds only what MetaSchedule's own search spaces produce for llvm
and CUDA targets, each instruction checked for its inputs and attributes:

- **kinds**: looking blocks and loops up (``GetSBlock``, ``GetLoops``, ``GetChildBlocks``,
  ``GetProducers``, ``GetConsumers``, ``GetOutputBlocks``), sampling (``SamplePerfectTile``,
  ``SamplePartitionedTile``, ``SampleCategorical``, ``SampleComputeLocation``), loop
  transformations (``Split``, ``Fuse``, ``Reorder``, ``AddUnitLoop``, ``Parallel``,
  ``Vectorize``, ``Bind``), block moves and caches (``CacheRead``, ``CacheWrite``,
  ``ComputeAt``, ``ReverseComputeAt``, ``ComputeInline``, ``ReverseComputeInline``,
  ``DecomposeReduction``, ``RFactor``, ``SetScope``, ``StorageAlign`` as a GPU's padding:
  a factor up to 128), ``Annotate`` and ``Unannotate`` of allowlisted keys, and
  ``EnterPostproc``. TVM checks each of these rewrites
  for correctness as it replays them; none names code, a file or a type;
- refused: ``TransformLayout``, ``TransformBlockLayout`` and ``AnnotateBufferAccess`` carry
  serialised TVM objects (index maps: expressions that ``tvm.ir.load_json`` would build, and that
  crashes on malformed input), ``UnsafeSetDType`` and ``UnsafeHideBufferAccess`` change results
  unchecked (by their names), ``Tensorize`` and ``Blockize`` swap computations for named
  intrinsics (tensor cores, VNNI: a served record would pick the code the kernel runs), and any
  kind not listed (``ReIndex``, ``PadEinsum``, ``LoopPartition``, ``RollingBuffer``...).
  ``Unroll`` too: MetaSchedule unrolls through bounded annotations, and a served ``Unroll`` of a
  large fused loop made a build run for minutes;
  MetaSchedule emits the tensorizing ones (and ``ReIndex``) only for tensor-core and int8 dot
  product spaces (float16 on CUDA, int8 on x86), which no built-in workload tunes: such records
  stay local to the process that tuned them;
- **decisions**: each sampling instruction has its decision (MetaSchedule records them all):
  without one, TVM samples anew in each process that reads the record, and ranks differ;
- **values**: a string input is a random variable's name (``b0``, ``l12``, ``v5``), ``"None"``
  as a ``Split`` factor, or an ``Annotate`` value as its key allows (:data:`ANNOTATIONS`: a
  variable, a bounded integer, a list of them, or ``"[SR]{1,16}"`` for
  ``meta_schedule.tiling_structure``); ``Bind`` axes are CUDA's thread axes
  (:data:`THREAD_AXES`), storage scopes are :data:`SCOPES`, block and function names are
  identifiers; unroll steps are at most :data:`MAX_UNROLL`, so a record cannot make a build
  unroll without bound; a ``Split`` keeps its bounds check (``disable_predication`` off: without
  it, factors that do not divide the loop read and write past the buffers);
- **size**: at most :data:`MAX_INSTRUCTIONS` instructions, of which at most :data:`MAX_STAGES`
  add a block (``CacheRead``, ``CacheWrite``, ``RFactor``, ``DecomposeReduction``) and which add
  at most :data:`MAX_LOOPS` loops (a ``Split``'s outputs, ``AddUnitLoop``), and whose
  ``Reorder`` and ``Fuse`` name at most :data:`MAX_MOVES` loops in all: each of these makes
  every later rewrite and the build slower, and 1,000 chained ``CacheRead`` of one buffer (each
  allowed, 52 KB of JSON) made one ``compile_tir`` replay and build for 44 s; MetaSchedule's own
  traces add a few blocks and loops per block;
- **the device**: a trace for a CPU (an ``llvm`` target; every built-in TVM record, which builds
  for the host) holds nothing of a GPU's: no ``Bind`` to thread axes, no thread-extent,
  cooperative-fetch or software-pipeline annotations, no ``StorageAlign``, only the ``global``
  storage scope (TVM accepts those on llvm at replay, then fails or raises in the build that
  follows).

Nothing here imports TVM: the server runs these checks too.

Example:
    >>> trace_problem([[["Annotate", ["l1", '"int f;"'], ["pragma_import_llvm"], []]], []])
    "trace[0][0] (Annotate): annotation key 'pragma_import_llvm' is not allowed"
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

from tunecache.configcheck.triton import strict_int
from tunecache.problem import describe

MAX_INSTRUCTIONS: Final = 4096
# At each bound a chain of them (the slowest: each rewrite of the last) replays and builds in
# 0.2 s on this project's CPUs, all three at theirs a record's check takes 0.4 s; MetaSchedule's
# traces of the built-in and test kernels add at most 6 blocks and 13 loops and name 24 in
# Reorder and Fuse (llvm and CUDA; a fused conv, attention and conv3d: 12 blocks, 35 loops).
MAX_STAGES: Final = 128  # instructions adding a block
MAX_LOOPS: Final = 512  # loops added (Split outputs, AddUnitLoop)
MAX_MOVES: Final = 1024  # loops named by Reorder and Fuse: MetaSchedule's name tens
STAGE_KINDS: Final = frozenset({"CacheRead", "CacheWrite", "RFactor", "DecomposeReduction"})
MAX_ITEMS: Final = 256  # inputs, attributes or outputs of one instruction; list values
MAX_UNROLL: Final = 4096  # an unroll step (MetaSchedule samples 0..1024)
MAX_EXTENT: Final = 2**20  # parallel/vectorize/thread extents
MAX_TILE: Final = 2**31 - 1
MAX_ALIGN: Final = 128  # a StorageAlign factor (MetaSchedule's is 32)

THREAD_AXES: Final = frozenset(
    {f"{kind}.{axis}" for kind in ("blockIdx", "threadIdx", "vthread") for axis in "xyz"}
    | {"vthread"}
)
SCOPES: Final = frozenset({"global", "shared", "shared.dyn", "local", "warp"})
CPU_SCOPES: Final = frozenset({"global"})
# What only a GPU's build takes: on a CPU these replay, then break the build (``StorageAlign``:
# MetaSchedule pads only a GPU's shared memory, and a served one broke a CPU's build).
GPU_KINDS: Final = frozenset({"Bind", "StorageAlign"})
GPU_ANNOTATIONS: Final = frozenset({
    "meta_schedule.thread_extent_low_inclusive", "meta_schedule.thread_extent_high_inclusive",
    "meta_schedule.cooperative_fetch", "software_pipeline_stage", "software_pipeline_order",
    "software_pipeline_async_stages",
})  # fmt: skip
GPU_DEVICES: Final = frozenset({"cuda", "rocm"})

_RV: Final = re.compile(r"[blv][0-9]{1,7}")
_BLOCK: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,127}")
_TILING: Final = re.compile(r'"[SR]{1,16}"')

Check = Callable[[Any], str | None]


# -- values -------------------------------------------------------------------------------------
def _int_in(low: int, high: int) -> Check:
    def check(value: Any) -> str | None:
        if strict_int(value) and low <= value <= high:
            return None
        return f"{describe(value, 30)} is not an integer in {low}..{high}"

    return check


def _rv(value: Any) -> str | None:
    if isinstance(value, str) and _RV.fullmatch(value):
        return None
    return f"{describe(value, 30)} is not a random variable's name (b0, l1, v2)"


def _rv_or(other: Check) -> Check:
    def check(value: Any) -> str | None:
        return None if isinstance(value, str) and _RV.fullmatch(value) else other(value)

    return check


def _flag(value: Any) -> str | None:
    ok = isinstance(value, bool) or (strict_int(value) and value in (0, 1))
    return None if ok else f"{describe(value, 30)} is not a flag"


def _int_list(low: int, high: int, size: int = 64) -> Check:
    item = _int_in(low, high)

    def check(value: Any) -> str | None:
        if not isinstance(value, list) or not 0 < len(value) <= size:
            return f"{describe(value, 30)} is not a list of 1..{size} integers"
        return next((why for v in value if (why := item(v))), None)

    return check


def _tiling(value: Any) -> str | None:
    if isinstance(value, str) and _TILING.fullmatch(value):
        return None
    return f"{describe(value, 30)} is not a quoted tiling structure of S and R"


def _block_name(value: Any) -> str | None:
    if isinstance(value, str) and _BLOCK.fullmatch(value):
        return None
    return f"{describe(value, 30)} is not a block or function name"


def _one_of(allowed: frozenset[str], what: str) -> Check:
    def check(value: Any) -> str | None:
        if isinstance(value, str) and value in allowed:
            return None
        return f"{what} {describe(value, 30)} is not allowed"

    return check


def _split_factor(value: Any) -> str | None:
    if value == "None" or (isinstance(value, str) and _RV.fullmatch(value)):
        return None
    if strict_int(value) and 1 <= value <= MAX_TILE:
        return None
    return f"{describe(value, 30)} is not a split factor (a variable, None or 1..{MAX_TILE})"


def _split_attrs(attrs: list[Any]) -> str | None:
    """``[preserve_unit_iters]`` or ``[preserve_unit_iters, disable_predication]``, the latter
    off: a ``Split`` whose factors do not divide the loop without its bounds check reads and
    writes past the buffers (a served one summed past each row, and wrote past the output)."""
    if not 1 <= len(attrs) <= 2:
        return f"has {len(attrs)} items, not 1 or 2"
    if (why := _flag(attrs[0])) is not None:
        return f"item 0: {why}"
    off = len(attrs) == 1 or attrs[1] is False or (strict_int(attrs[1]) and attrs[1] == 0)
    if not off:
        return f"item 1: disable_predication must be off, not {describe(attrs[1], 30)}"
    return None


# Annotation key -> what its value may be (the value of ``Annotate``; ``Unannotate`` the key).
ANNOTATIONS: Final[dict[str, Check]] = {
    "meta_schedule.tiling_structure": _tiling,
    "meta_schedule.parallel": _int_in(0, MAX_EXTENT),
    "meta_schedule.vectorize": _int_in(0, MAX_EXTENT),
    "meta_schedule.unroll_explicit": _rv_or(_int_in(0, MAX_UNROLL)),
    "meta_schedule.unroll_implicit": _rv_or(_int_in(0, MAX_UNROLL)),
    "meta_schedule.thread_extent_low_inclusive": _int_in(0, MAX_EXTENT),
    "meta_schedule.thread_extent_high_inclusive": _int_in(0, MAX_EXTENT),
    "meta_schedule.cooperative_fetch": _rv_or(_int_in(0, 64)),
    "meta_schedule.random_compute_producer": _int_in(0, 1),
    "pragma_auto_unroll_max_step": _rv_or(_int_in(0, MAX_UNROLL)),
    "pragma_unroll_explicit": _rv_or(_int_in(0, 1)),
    "software_pipeline_stage": _int_list(0, 64),
    "software_pipeline_order": _int_list(0, 64),
    "software_pipeline_async_stages": _int_list(0, 64),
}


# -- instructions -------------------------------------------------------------------------------
def _fixed(*checks: Check) -> Callable[[list[Any]], str | None]:
    """Exactly ``len(checks)`` items, the i-th passing ``checks[i]``."""

    def check(items: list[Any]) -> str | None:
        if len(items) != len(checks):
            return f"has {len(items)} items, not {len(checks)}"
        return next(
            (f"item {i}: {why}" for i, c in enumerate(checks) if (why := c(items[i]))), None
        )

    return check


def _many(item: Check, least: int = 0) -> Callable[[list[Any]], str | None]:
    """``least`` to :data:`MAX_ITEMS` items, each passing ``item``."""

    def check(items: list[Any]) -> str | None:
        if not least <= len(items) <= MAX_ITEMS:
            return f"has {len(items)} items, not {least}..{MAX_ITEMS}"
        return next((f"item {i}: {why}" for i, v in enumerate(items) if (why := item(v))), None)

    return check


def _head(first: Check, rest: Check, least: int = 0) -> Callable[[list[Any]], str | None]:
    """A first item passing ``first`` and ``least`` or more passing ``rest``."""
    tail = _many(rest, least)

    def check(items: list[Any]) -> str | None:
        if not items:
            return "is empty"
        if (why := first(items[0])) is not None:
            return f"item 0: {why}"
        return tail(items[1:])

    return check


def _rv_list(value: Any) -> str | None:
    if not isinstance(value, list):
        return f"{describe(value, 30)} is not a list of random variables"
    return _many(_rv)(value)


_NONE = _fixed()
_ONE = _fixed(_rv)
_RVS = _many(_rv)
_SCOPE = _one_of(SCOPES, "storage scope")
_INDEX = _int_in(0, MAX_ITEMS)
_POSITION = _int_in(-2, MAX_ITEMS)  # a loop index; -1 and -2 name the root and inlining
_SMALL = _int_in(-MAX_EXTENT, MAX_EXTENT)


def _storage_align_attrs(attrs: list[Any]) -> str | None:
    """``[buffer_index, axis, factor, offset]`` as MetaSchedule emits them (``0, -2, 32, 8``
    for float16 tensor cores and, in TVM 0.1x, after a cooperative fetch; ``0, -2, 32, 16`` for
    int8 tensor cores: shared memory padded against bank conflicts): an axis counted from the end
    other than the innermost (a positive one may be the innermost), a factor a power of two up
    to :data:`MAX_ALIGN`, ``0 <= offset < factor``. A served factor of 2**20 made the consumer's
    build overflow int32, and 512 on three cache buffers doubled a process's memory."""
    if (why := _fixed(_INDEX, _int_in(-8, -2), _int_in(1, MAX_ALIGN), _SMALL)(attrs)) is not None:
        return why
    factor, offset = attrs[2], attrs[3]
    if factor & (factor - 1):
        return f"item 2: factor {factor} is not a power of two"
    if not 0 <= offset < factor:
        return f"item 3: offset {offset} is not in 0..{factor - 1} (below the factor)"
    return None


def _categorical_attrs(attrs: list[Any]) -> str | None:
    """``[candidates, probabilities]``: bounded integers, as many probabilities in [0, 1]."""
    if len(attrs) != 2:
        return f"has {len(attrs)} items, not 2"
    candidates, probs = attrs
    if (why := _int_list(0, MAX_UNROLL)(candidates)) is not None:
        return f"candidates: {why}"
    if not isinstance(probs, list) or len(probs) != len(candidates):
        return "the probabilities are not a list as long as the candidates"
    for p in probs:
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0 <= p <= 1:
            return f"probability {describe(p, 30)} is not a number in [0, 1]"
    return None


# kind -> (inputs, attributes, outputs): what each may hold.
Shape = tuple[Callable[[list[Any]], str | None], ...]
KINDS: Final[dict[str, Shape]] = {
    "GetSBlock": (_NONE, _fixed(_block_name, _block_name), _ONE),
    "GetLoops": (_ONE, _NONE, _RVS),
    "GetChildBlocks": (_ONE, _NONE, _RVS),
    "GetProducers": (_ONE, _NONE, _RVS),
    "GetConsumers": (_ONE, _NONE, _RVS),
    "GetOutputBlocks": (_ONE, _NONE, _RVS),
    "SamplePerfectTile": (_ONE, _fixed(_int_in(1, 16), _SMALL), _many(_rv, 1)),
    "SamplePartitionedTile": (_ONE, _fixed(_int_in(1, 16), _SMALL, _SMALL), _many(_rv, 1)),
    "SampleCategorical": (_NONE, _categorical_attrs, _ONE),
    "SampleComputeLocation": (_ONE, _NONE, _ONE),
    "Split": (_head(_rv, _split_factor, 1), _split_attrs, _many(_rv, 1)),
    "Fuse": (_many(_rv, 1), _many(_flag), _ONE),
    "Reorder": (_many(_rv, 1), _NONE, _NONE),
    "AddUnitLoop": (_ONE, _NONE, _ONE),
    "Parallel": (_ONE, _NONE, _NONE),
    "Vectorize": (_ONE, _NONE, _NONE),
    "Bind": (_ONE, _fixed(_one_of(THREAD_AXES, "thread axis")), _NONE),
    "CacheRead": (_fixed(_rv, _rv_list), _fixed(_INDEX, _SCOPE), _ONE),
    "CacheWrite": (_fixed(_rv, _rv_list), _fixed(_INDEX, _SCOPE), _ONE),
    "SetScope": (_ONE, _fixed(_INDEX, _SCOPE), _NONE),
    "StorageAlign": (_ONE, _storage_align_attrs, _NONE),
    "ComputeAt": (_fixed(_rv, _rv), _fixed(_flag, _POSITION), _NONE),
    "ReverseComputeAt": (_fixed(_rv, _rv), _fixed(_flag, _POSITION), _NONE),
    "ComputeInline": (_ONE, _NONE, _NONE),
    "ReverseComputeInline": (_ONE, _NONE, _NONE),
    "DecomposeReduction": (_fixed(_rv, _rv), _NONE, _ONE),
    "RFactor": (_ONE, _fixed(_INDEX), _ONE),
    "Annotate": (_NONE, _NONE, _NONE),  # inputs and attributes: _annotate_problem
    "Unannotate": (_NONE, _NONE, _NONE),
    "EnterPostproc": (_NONE, _NONE, _NONE),
}
_SAMPLING: Final = ("SamplePerfectTile", "SamplePartitionedTile", "SampleCategorical",
                    "SampleComputeLocation")  # fmt: skip


def _annotate_problem(kind: str, inputs: list[Any], attrs: list[Any]) -> str | None:
    """An ``Annotate``'s or ``Unannotate``'s key (and value) against :data:`ANNOTATIONS`."""
    if len(attrs) != 1:
        return f"attributes have {len(attrs)} items, not 1 (the key)"
    key = attrs[0]
    if not isinstance(key, str) or key not in ANNOTATIONS:
        return f"annotation key {describe(key, 60)} is not allowed"
    want = 2 if kind == "Annotate" else 1
    if len(inputs) != want:
        return f"inputs have {len(inputs)} items, not {want}"
    if (why := _rv(inputs[0])) is not None:
        return f"input 0: {why}"
    if kind == "Annotate" and (why := ANNOTATIONS[key](inputs[1])) is not None:
        return f"the value of {key}: {why}"
    return None


def _cpu_problem(kind: str, attrs: list[Any]) -> str | None:
    """What a CPU's build cannot take in an otherwise allowed instruction, or ``None``."""
    if kind in GPU_KINDS:
        return f"instruction kind {kind} is for a GPU; this trace is for a CPU"
    if kind in ("Annotate", "Unannotate") and attrs and attrs[0] in GPU_ANNOTATIONS:
        return f"annotation key {attrs[0]!r} is for a GPU; this trace is for a CPU"
    if kind in ("CacheRead", "CacheWrite", "SetScope") and attrs[-1] not in CPU_SCOPES:
        return f"storage scope {describe(attrs[-1], 30)} is for a GPU; this trace is for a CPU"
    return None


def instruction_problem(inst: Any, device: str = "cpu") -> str | None:
    """Why one ``[kind, inputs, attrs, outputs]`` instruction may not be served in a trace for
    ``device`` (``cpu``, ``cuda`` or ``rocm``), or ``None``."""
    if not (isinstance(inst, list) and len(inst) == 4 and isinstance(inst[0], str)):
        return "is not [kind, inputs, attributes, outputs]"
    kind, inputs, attrs, outputs = inst
    shape = KINDS.get(kind)
    if shape is None:
        return f"instruction kind {describe(kind, 40)} is not allowed"
    if not all(isinstance(part, list) for part in (inputs, attrs, outputs)):
        return "inputs, attributes or outputs are not lists"
    if kind in ("Annotate", "Unannotate"):
        why = _annotate_problem(kind, inputs, attrs) or _outputs(_NONE(outputs))
        return why or (None if device in GPU_DEVICES else _cpu_problem(kind, attrs))
    for part, check, value in zip(("inputs", "attributes", "outputs"), shape,
                                  (inputs, attrs, outputs), strict=True):  # fmt: skip
        if (why := check(value)) is not None:
            return f"{part} {why}"
    return None if device in GPU_DEVICES else _cpu_problem(kind, attrs)


def _outputs(why: str | None) -> str | None:
    return None if why is None else f"outputs {why}"


def _decision_problem(inst: list[Any], value: Any) -> str | None:
    """Why ``value`` is not a decision of the sampling instruction ``inst``, or ``None``."""
    kind = inst[0]
    if kind not in _SAMPLING:
        return f"{kind} takes no decision"
    if kind == "SampleCategorical":
        return _int_in(0, len(inst[2][0]) - 1)(value)
    if kind == "SampleComputeLocation":
        return _int_in(-2, MAX_TILE)(value)
    tiles = _int_list(1, MAX_TILE, size=16)(value)
    if tiles is None and len(value) != len(inst[3]):
        return f"{len(value)} tiles for {len(inst[3])} outputs"
    return tiles


def trace_problem(trace: Any, device: str = "cpu") -> str | None:
    """Why a trace's ``[instructions, decisions]`` JSON may not be served for ``device``
    (``cpu``: an llvm target; ``cuda``, ``rocm``), or ``None``.

    The reason names the place, e.g. ``trace[0][12] (Annotate): annotation key
    'pragma_import_llvm' is not allowed``. Also what TVM does not check and would crash on: a
    decision for no instruction, a zero tile; and a sampling instruction without its decision
    (TVM would pick one at random as each process reads it).
    """
    if not (isinstance(trace, list) and len(trace) == 2):
        return "trace is not [instructions, decisions]"
    insts, decisions = trace
    if not isinstance(insts, list) or not isinstance(decisions, list):
        return "trace is not [instructions, decisions]"
    if len(insts) > MAX_INSTRUCTIONS:
        return f"trace has {len(insts)} instructions, over {MAX_INSTRUCTIONS}"
    if not within_int64(trace):
        return "trace holds an integer TVM cannot take (or is nested too deep)"
    for i, inst in enumerate(insts):
        if (why := instruction_problem(inst, device)) is not None:
            kind = inst[0] if isinstance(inst, list) and inst and isinstance(inst[0], str) else ""
            kind = kind if kind in KINDS else ""
            return f"trace[0][{i}]{f' ({kind})' if kind else ''}: {why}"
    return _size_problem(insts) or _decisions_problem(insts, decisions)


def _size_problem(insts: list[Any]) -> str | None:
    """Why checked instructions ``insts`` add too many blocks or loops to replay and build in
    bounded time, or ``None``."""
    stages = sum(inst[0] in STAGE_KINDS for inst in insts)
    if stages > MAX_STAGES:
        return (f"trace adds {stages} blocks (CacheRead, CacheWrite, RFactor, "
                f"DecomposeReduction), over {MAX_STAGES}")  # fmt: skip
    loops = sum(len(inst[3]) for inst in insts if inst[0] in ("Split", "AddUnitLoop"))
    if loops > MAX_LOOPS:
        return f"trace adds {loops} loops (Split, AddUnitLoop), over {MAX_LOOPS}"
    moves = sum(len(inst[1]) for inst in insts if inst[0] in ("Reorder", "Fuse"))
    if moves > MAX_MOVES:  # 3,700 Reorders of 251 loops each replayed for 2.5 s
        return f"trace reorders or fuses {moves} loops (Reorder, Fuse), over {MAX_MOVES}"
    return None


def _decisions_problem(insts: list[Any], decisions: list[Any]) -> str | None:
    """Why the decisions of checked instructions ``insts`` may not be served, or ``None``: one
    for each sampling instruction and for no other, each a value it can take. Without its
    decision, TVM samples a fresh one as it reads the record, in each process (a tile of a loop
    before an ``RFactor``: each rank summed in its own order, their results differed)."""
    seen: set[int] = set()
    for i, decision in enumerate(decisions):
        where = f"trace[1][{i}]"
        if not (isinstance(decision, list) and len(decision) == 2):
            return f"{where}: a decision is not [instruction index, value]"
        index = decision[0]
        if not strict_int(index) or not 0 <= index < len(insts):
            return f"{where}: names instruction {describe(index, 20)}, not one of the trace's"
        if index in seen:
            return f"{where}: a second decision for instruction {index}"
        seen.add(index)
        if (why := _decision_problem(insts[index], decision[1])) is not None:
            return f"{where}: the decision for instruction {index}: {why}"
    for i, inst in enumerate(insts):
        if inst[0] in _SAMPLING and i not in seen:
            return (f"trace[0][{i}] ({inst[0]}): a sampling instruction without its decision "
                    "(each process would sample its own)")  # fmt: skip
    return None


def within_int64(value: Any, depth: int = 0) -> bool:
    """Whether every integer in ``value`` fits TVM's int64 (and the nesting is sane)."""
    if depth > 32:
        return False
    if isinstance(value, bool) or not isinstance(value, int | list | dict):
        return True
    if isinstance(value, int):
        return -(2**63) <= value < 2**63
    items = value.values() if isinstance(value, dict) else value
    return all(within_int64(v, depth + 1) for v in items)


__all__ = [
    "ANNOTATIONS",
    "GPU_DEVICES",
    "KINDS",
    "MAX_ITEMS",
    "MAX_LOOPS",
    "MAX_MOVES",
    "MAX_STAGES",
    "SCOPES",
    "THREAD_AXES",
    "instruction_problem",
    "trace_problem",
    "within_int64",
]
