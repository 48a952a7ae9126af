"""A served MetaSchedule record whose instructions are each allowed, yet would change a result or
kill the process once built, is never used: a ``Split`` without its bounds check, a vectorized
loop wider than a build takes. The records come from a hostile server at the client's transport;
TVM's own ``compile_tir`` asks ``tunecache.tvm.Database`` for them, as a user's code would."""

from __future__ import annotations

import datetime
import functools
import json
import logging
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm import te  # noqa: E402
from tvm.s_tir import Schedule  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod  # noqa: E402

import tunecache.tvm.remote as remote  # noqa: E402
from tunecache.tvm import Database  # noqa: E402
from tunecache.tvm.check import MAX_LANES, args_info_json  # noqa: E402
from tunecache.tvm.wire import workload_key  # noqa: E402

TARGET = {"kind": "llvm", "num-cores": 1}


def served(mod: Any, schedule: Callable[[Schedule], None], monkeypatch: pytest.MonkeyPatch) -> Any:
    """``compile_tir``'s answer for ``mod`` from a server holding one record: ``schedule``'s
    trace, claiming the fastest time there is."""
    sch = Schedule(mod)
    schedule(sch)
    trace = json.loads(json.dumps(sch.trace.as_json(), default=lambda o: getattr(o, "value", o)))
    value = [trace, [1e-9], TARGET, args_info_json(mod)]
    key = workload_key(mod)

    def answer(request: httpx.Request) -> httpx.Response:
        asked = dict(request.url.params)
        items = []
        if asked.get("namespace") == "tvm.record" and asked.get("key") == key:
            items = [{"namespace": "tvm.record", "partition": asked["partition"], "key": key,
                      "item": "x", "value": value, "score": 1e-9, "id": 1,
                      "updated_at": datetime.datetime.now().isoformat()}]  # fmt: skip
        return httpx.Response(200, json={"items": items, "next_after": None},
                              headers={"Tunecache-Server": "tunecache/0"})  # fmt: skip

    monkeypatch.setattr(remote, "Client",
                        functools.partial(remote.Client, transport=httpx.MockTransport(answer)))  # fmt: skip
    target = tvm.target.Target(TARGET)
    database = Database("http://hostile.test", target=target, token="", timeout=5)
    return ms.tir_integration.compile_tir(database, mod, target)


def run(mod: Any, *arrays: np.ndarray) -> list[np.ndarray]:
    lib = tvm.tirx.build(mod, target=tvm.target.Target(TARGET))
    held = [tvm.runtime.tensor(a, tvm.cpu()) for a in arrays]
    lib(*held)
    return [h.numpy() for h in held]


def row_sum(n: int) -> Any:
    a = te.placeholder((4, n), "float32", name="A")
    k = te.reduce_axis((0, n), name="k")
    return _normalize_mod(
        te.create_prim_func([a, te.compute((4,), lambda i: te.sum(a[i, k], axis=k))])
    )


@pytest.mark.parametrize("unchecked", [False, True], ids=["checked", "unchecked"])
def test_a_split_without_its_bounds_check_is_not_served(
    unchecked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row sum over 10 split by 4: with the bounds check the served schedule is used and
    right; without it (``disable_predication``), it summed past each row ([78, 198, 318, 355]
    for [55, 155, 255, 355]): now it is not served, and the function is built as written."""
    mod = row_sum(10)

    def split(sch: Schedule) -> None:
        block = sch.get_sblock("compute")
        sch.split(sch.get_loops(block)[1], [None, 4], disable_predication=unchecked)

    scheduled = served(mod, split, monkeypatch)
    assert (scheduled is None) == unchecked
    a = np.arange(1, 41, dtype="float32").reshape(4, 10)
    _, out = run(mod if scheduled is None else scheduled.mod, a, np.zeros(4, "float32"))
    assert out.tolist() == a.sum(1).tolist()


@pytest.mark.parametrize("lanes", [16, 32768])
def test_a_vectorized_loop_wider_than_a_build_takes_is_not_served(
    lanes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An add over 32768 elements split by ``lanes`` and vectorized: 16 lanes are served and
    built; 32768 made TVM's build raise (65536 killed the process: SIGFPE), and is not served."""
    n = 32768
    a, b = te.placeholder((n,), "float32", name="A"), te.placeholder((n,), "float32", name="B")
    mod = _normalize_mod(te.create_prim_func([a, b, te.compute((n,), lambda i: a[i] + b[i])]))

    def vectorize(sch: Schedule) -> None:
        (loop,) = sch.get_loops(sch.get_sblock("compute"))
        sch.vectorize(sch.split(loop, [None, lanes])[1])

    scheduled = served(mod, vectorize, monkeypatch)
    assert (scheduled is None) == (lanes > MAX_LANES)
    x, y = np.ones(n, "float32"), np.full(n, 2.0, "float32")
    *_, out = run(mod if scheduled is None else scheduled.mod, x, y, np.zeros(n, "float32"))
    assert (out == 3.0).all()


def test_a_config_whose_trace_vectorizes_too_wide_is_refused_where_it_is_built() -> None:
    """The backend's own path (a served ``meta_schedule`` config built by a consumer, or
    re-timed by a verifier) replays the trace too: 32,768 lanes are refused before the build."""
    from backends.tvm.schedule import apply_trace, trace_json
    from tunecache.errors import InvalidInput

    n = 32768
    a, b = te.placeholder((n,), "float32", name="A"), te.placeholder((n,), "float32", name="B")
    func = te.create_prim_func([a, b, te.compute((n,), lambda i: a[i] + b[i])])
    sch = Schedule(func)
    (loop,) = sch.get_loops(sch.get_sblock("compute"))
    sch.vectorize(sch.split(loop, [None, n])[1])
    with pytest.raises(InvalidInput, match=f"{n} vectorized lanes, more than {MAX_LANES}"):
        apply_trace(func, trace_json(sch.trace))


def add(n: int) -> Any:
    a, b = te.placeholder((n,), "float32", name="A"), te.placeholder((n,), "float32", name="B")
    return _normalize_mod(te.create_prim_func([a, b, te.compute((n,), lambda i: a[i] + b[i])]))


def pad(*splits: tuple[list[int | None], int]) -> Callable[[Schedule], None]:
    """Splits the add's loop by the first factors, then one of the loops made (0: the outer, -1:
    the inner) by the next, and so on."""

    def schedule(sch: Schedule) -> None:
        (loop,) = sch.get_loops(sch.get_sblock("compute"))
        for factors, which in splits:
            loop = sch.split(loop, factors)[which]

    return schedule


def repeat(sch: Schedule) -> None:
    """A unit loop above the add, split by 256 x 256: a loop no binding names, walked 65536
    times behind a bounds check that keeps the add's result."""
    loop = sch.add_unit_loop(sch.get_sblock("compute"))
    sch.split(loop, [256, 256])


@pytest.mark.parametrize(
    ("schedule", "kept"),
    [(pad(([None, 48], 0)), True), (pad(([None, 300], 0)), True),
     (pad(([None, 32768], 0)), True), (pad(([4096, 4096], 0)), False),
     (pad(([None, 32768], 0), ([None, 64], 0)), False), (repeat, False)],
    ids=["pads-a-tile", "past-the-loop", "a-millisecond", "far-past", "outer-of-one", "unit-loop"],
)  # fmt: skip
def test_a_schedule_padding_a_block_far_past_its_space_is_not_served(
    schedule: Callable[[Schedule], None], kept: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An add over 128 elements whose loop a served trace split by 32768 x 32768, twice: each
    instruction is allowed and the bounds check kept its result, but the kernel looped 2**45
    times (a run of hours; one split alone took 1.6 s). A split padding a tile (48 over 128, 300
    past it, or 32768: a millisecond of empty iterations at most) is served; one padding the
    block far past its iteration space (4096 x 4096: a bound a test can run without it), the
    loop of one left by a split split again, or a unit loop split so, is not."""
    mod = add(128)
    scheduled = served(mod, schedule, monkeypatch)
    assert (scheduled is not None) == kept
    x, y = np.ones(128, "float32"), np.full(128, 2.0, "float32")
    *_, out = run(mod if scheduled is None else scheduled.mod, x, y, np.zeros(128, "float32"))
    assert (out == 3.0).all()


def test_a_config_whose_trace_pads_far_past_its_space_is_refused_where_it_is_built() -> None:
    """The backend's own path (a consumer building a served config, a verifier re-timing it)."""
    from backends.tvm.schedule import apply_trace, trace_json
    from tunecache.errors import InvalidInput

    func = add(128)["main"]
    sch = Schedule(func)
    pad(([32768, 32768], -1), ([32768, 32768], -1))(sch)
    with pytest.raises(InvalidInput, match=r"block compute runs .* iterations, more than 16 "
                                            r"times the module's largest block \(128\)"):  # fmt: skip
        apply_trace(func, trace_json(sch.trace))


def test_a_loop_that_only_repeats_a_block_is_refused() -> None:
    """A loop above a block that no block below it walks (its bindings and bounds check name it
    not) only repeats the block: 1000 repeats of an add are refused, the add itself is not."""
    from tvm.script import tirx as T

    from tunecache.tvm.check import work_problem

    @T.prim_func(s_tir=True)
    def repeated(a: T.Buffer((128,), "float32"), c: T.Buffer((128,), "float32")) -> None:
        for _ in range(1000):
            for i in range(128):
                with T.sblock("compute"):
                    v = T.axis.spatial(128, i)
                    c[v] = a[v] + T.float32(1)

    original = add(128)
    assert work_problem(Schedule(original), original) is None
    assert work_problem(Schedule(repeated), original) == (
        "loop _ (1000 long) repeats blocks none of which walks it"
    )


def gemv(rows: int, k: int) -> Any:
    x = te.placeholder((rows, k), "float32", name="x")
    w = te.placeholder((k,), "float32", name="w")
    r = te.reduce_axis((0, k), name="k")
    y = te.compute((rows,), lambda i: te.sum(x[i, r] * w[r], axis=r), name="y")
    return _normalize_mod(te.create_prim_func([x, w, y]))


def test_a_producer_padded_inside_a_padded_loop_of_its_consumer_is_refused() -> None:
    """Each block within its own bound, a copy of ``w`` computed inside a padded loop of the
    GEMV that reads it, and padded itself, multiplied the two: 1.2e9 iterations for 8,192
    multiply-adds (allowed instructions only: CacheRead, Split, ComputeAt)."""
    from tunecache.tvm.check import PADDING_ITERATIONS, work_problem

    mod = gemv(128, 64)
    sch = Schedule(mod)
    block = sch.get_sblock("y")
    copy = sch.cache_read(block, 1, "global")
    outer, _ = sch.split(sch.get_loops(block)[0], [None, 16])
    padded, _ = sch.split(outer, [(16 * 128 * 64 + PADDING_ITERATIONS) // (16 * 64), None])
    sch.compute_at(copy, padded)
    sch.split(sch.get_loops(copy)[1], [16 * 64 + PADDING_ITERATIONS, None])
    why = work_problem(sch, mod)
    assert why is not None and why.startswith("its blocks run 1.21e+09 iterations in all"), why


@pytest.mark.parametrize("rows", [1024, 32768])
def test_a_reduction_split_over_more_gpu_threads_than_it_has_is_served(rows: int) -> None:
    """MetaSchedule's cross-thread reduction on CUDA splits a reduction by a sampled thread
    extent (up to 512) whatever its length: 28 over 512 threads, at 32,768 rows, was refused as
    padding. Threads run side by side: a loop bound to them is not counted."""
    from tunecache.tvm.check import work_problem

    x = te.placeholder((rows, 28), "float32", name="x")
    r = te.reduce_axis((0, 28), name="k")
    mod = _normalize_mod(te.create_prim_func([x, te.compute((rows,), lambda i: te.sum(
        x[i, r], axis=r), name="y")]))  # fmt: skip
    sch = Schedule(mod)
    i, k = sch.get_loops(sch.get_sblock("y"))
    sch.bind(sch.split(k, [None, 512])[1], "threadIdx.x")
    sch.bind(i, "blockIdx.x")
    assert work_problem(sch, mod) is None


def test_a_gpu_tiles_copy_made_for_each_thread_block_is_served() -> None:
    """MetaSchedule's CUDA matmul copies each thread block's tile of ``A`` into shared memory
    under the fused loop of thread blocks: ``A`` is copied once for each tile of ``N`` (37 times
    at N=37 in its own spaces, 64 times here), which a bound on the copy's own space refused."""
    from tunecache.tvm.check import work_problem

    a = te.placeholder((64, 64), "float32", name="A")
    b = te.placeholder((64, 1024), "float32", name="B")
    r = te.reduce_axis((0, 64), name="k")
    mod = _normalize_mod(te.create_prim_func([a, b, te.compute((64, 1024), lambda i, j: te.sum(
        a[i, r] * b[r, j], axis=r), name="C")]))  # fmt: skip
    sch = Schedule(mod)
    block = sch.get_sblock("C")
    i, j, k = sch.get_loops(block)
    i0, i1 = sch.split(i, [None, 16])
    j0, j1 = sch.split(j, [None, 16])
    sch.reorder(i0, j0, i1, j1, k)
    tiles = sch.fuse(i0, j0)
    copy = sch.cache_read(block, 0, "shared")
    sch.compute_at(copy, tiles)
    assert work_problem(sch, mod) is None


def test_a_loop_bound_to_more_threads_than_a_block_has_is_counted() -> None:
    """Loops bound to GPU threads are not counted, as a block's threads run side by side; but a
    block has at most 1,024 of them: a served split by 2**22 bound to ``threadIdx.x`` is counted
    as any loop is, and refused."""
    from tunecache.tvm.check import work_problem

    mod = add(128)
    sch = Schedule(mod)
    (loop,) = sch.get_loops(sch.get_sblock("compute"))
    sch.bind(sch.split(loop, [None, 2**22])[1], "threadIdx.x")
    why = work_problem(sch, mod)
    assert why is not None and why.startswith("block compute runs 4.19e+06 iterations"), why


def matmul(n: int) -> Any:
    a, b = te.placeholder((n, n), "float32", name="A"), te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return _normalize_mod(te.create_prim_func([a, b, c]))


# The audit's: a tile of the reduction sampled without its decision, before an RFactor.
UNDECIDED: list[Any] = [
    [["GetSBlock", [], ["C", "main"], ["b0"]], ["GetLoops", ["b0"], [], ["l1", "l2", "l3"]],
     ["SamplePerfectTile", ["l3"], [2, 64], ["v4", "v5"]],
     ["Split", ["l3", "v4", "v5"], [True, False], ["l6", "l7"]], ["RFactor", ["l6"], [0], ["b8"]]],
    [],
]  # fmt: skip


def test_a_record_tvm_must_invent_a_decision_for_is_not_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TVM reads a sampling instruction without its decision by sampling one, anew in each
    process: each rank built its own tiling of the sum. The schema refuses it, and so does the
    replay check behind it (the schema bypassed); with its decision, the record is used."""
    import tunecache.tvm.check as check

    mod = matmul(64)
    workload, args = ms.database.Workload(mod), args_info_json(mod)
    value = [UNDECIDED, [1e-6], TARGET, args]
    record, why = check.check_record(value, workload, args)
    assert record is None and why.startswith("trace[0][2] (SamplePerfectTile): a sampling "), why
    monkeypatch.setattr(check, "record_value_problem", lambda *_: None)
    record, why = check.check_record(value, workload, args)
    assert record is None, "a decision TVM sampled was kept"
    assert why.startswith("its instruction 2 (SamplePerfectTile) has no decision"), why
    decided = [[UNDECIDED[0], [[2, [2, 32]]]], [1e-6], TARGET, args]
    record, why = check.check_record(decided, workload, args)
    assert record is not None, why


def test_an_unbounded_storage_align_is_not_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit's: a cache of the matmul's ``A`` aligned by 2**20 replays, then the consumer's
    own build raised (an int32 overflow); MetaSchedule aligns only a GPU's shared memory, so a
    CPU's record holding it is not served, and the function is built as written."""
    mod = matmul(16)

    def align(sch: Schedule) -> None:
        cache = sch.cache_read(sch.get_sblock("C"), 0, "global")
        sch.storage_align(cache, 0, 1, 2**20, 2**20 - 1)

    assert served(mod, align, monkeypatch) is None
    a, b = np.ones((16, 16), "float32"), np.full((16, 16), 2.0, "float32")
    *_, out = run(mod, a, b, np.zeros((16, 16), "float32"))
    assert (out == 32.0).all()


def matmul_row_sum(n: int) -> Any:
    """The audit's: ``C = A @ B`` then ``D[i] = sum_j C[i, j]``."""
    a, b = te.placeholder((n, n), "float32", name="A"), te.placeholder((n, n), "float32", name="B")
    k, j = te.reduce_axis((0, n), name="k"), te.reduce_axis((0, n), name="j2")
    c = te.compute((n, n), lambda i, jj: te.sum(a[i, k] * b[k, jj], axis=k), name="C")
    d = te.compute((n,), lambda i: te.sum(c[i, j], axis=j), name="D")
    return _normalize_mod(te.create_prim_func([a, b, d]))


def sum_at(level: int) -> Callable[[Schedule], None]:
    """``D`` moved under loop ``level`` of ``C`` (0: its row ``i``; 2: its reduction ``k``)."""

    def schedule(sch: Schedule) -> None:
        loops = sch.get_loops(sch.get_sblock("C"))
        sch.reverse_compute_at(sch.get_sblock("D"), loops[level])

    return schedule


def test_a_consumer_moved_inside_its_producers_reduction_is_not_served(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The audit's: a served trace moved the row sum ``D`` under the ``k`` loop of the matmul
    ``C`` it reads (``ReverseComputeAt``, allowed); TVM accepted it and the kernel summed partial
    products (an error of ~574). It is refused with one warning naming it, and the function is
    built as written; ``D`` moved under ``C``'s row loop instead (after the row's reduction) is
    served, and right."""
    n = 16
    mod = matmul_row_sum(n)
    rng = np.random.default_rng(0)
    a, b = rng.random((n, n), dtype="float32"), rng.random((n, n), dtype="float32")
    want = (a.astype("float64") @ b.astype("float64")).sum(1)
    bad = Schedule(mod)
    sum_at(2)(bad)
    *_, partial = run(bad.mod, a, b, np.zeros(n, "float32"))
    assert not np.allclose(partial, want, rtol=1e-4), "the premise: built, it sums partial values"

    caplog.set_level(logging.WARNING, logger="tunecache.tvm")
    assert served(mod, sum_at(2), monkeypatch) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "ignoring record #1" in warnings[0], warnings
    assert "block D reads C inside loop k of block C's reduction" in warnings[0], warnings
    *_, out = run(mod, a, b, np.zeros(n, "float32"))
    np.testing.assert_allclose(out, want, rtol=1e-4)

    caplog.clear()
    honest = served(mod, sum_at(0), monkeypatch)
    assert honest is not None and not caplog.records, [r.getMessage() for r in caplog.records]
    assert "reverse_compute_at" in str(honest.trace)
    *_, out = run(honest.mod, a, b, np.zeros(n, "float32"))
    np.testing.assert_allclose(out, want, rtol=1e-4)


def test_a_config_reading_a_partial_reduction_is_refused_where_it_is_built() -> None:
    """The backend's own path (a consumer building a served config, a verifier re-timing it)."""
    from backends.tvm.schedule import apply_trace, trace_json
    from tunecache.errors import InvalidInput

    func = matmul_row_sum(16)["main"]
    sch = Schedule(func)
    sum_at(2)(sch)
    with pytest.raises(InvalidInput, match="block D reads C inside loop k of block C's reduct"):
        apply_trace(func, trace_json(sch.trace))
    sch = Schedule(func)
    sum_at(0)(sch)
    assert apply_trace(func, trace_json(sch.trace)) is not None


def test_an_init_inside_its_reduction_loop_is_refused() -> None:
    """A block writing what a reduction accumulates, under that reduction's loop, resets it on
    each step: refused like a read; the same init above the loop is not."""
    from tvm.script import tirx as T

    from tunecache.tvm.partial import partial_problem

    @T.prim_func(s_tir=True)
    def inside(a: T.Buffer((4, 8), "float32"), c: T.Buffer((4,), "float32")) -> None:
        for i, k in T.grid(4, 8):
            with T.sblock("init"):
                vi = T.axis.spatial(4, i)
                c[vi] = T.float32(0)
            with T.sblock("update"):
                vi, vk = T.axis.remap("SR", [i, k])
                c[vi] = c[vi] + a[vi, vk]

    @T.prim_func(s_tir=True)
    def above(a: T.Buffer((4, 8), "float32"), c: T.Buffer((4,), "float32")) -> None:
        for i in range(4):
            with T.sblock("init"):
                vi = T.axis.spatial(4, i)
                c[vi] = T.float32(0)
            for k in range(8):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    c[vi] = c[vi] + a[vi, vk]

    assert partial_problem(inside) == (
        "block init writes c inside loop k of block update's reduction, before that reduction "
        "has finished writing it (a partial result)"
    )
    assert partial_problem(above) is None


def test_a_blockized_reduction_is_not_refused_and_computes_right() -> None:
    """A reduction blockized (what tensor-core schedules do before they tensorize) holds its
    init and its update in the outer block, under the outer block's own reduction loop: not a
    block reading another's partial result. It was refused, and its result is right."""
    from tunecache.tvm.partial import partial_problem

    n = 32
    a, b = te.placeholder((n, n), name="A"), te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    sch = Schedule(tvm.IRModule({"main": te.create_prim_func([a, b, c])}))
    i, j, kk = sch.get_loops(sch.get_sblock("C"))
    i0, i1 = sch.split(i, [None, 8])
    j0, j1 = sch.split(j, [None, 8])
    k0, k1 = sch.split(kk, [None, 8])
    sch.reorder(i0, j0, k0, i1, j1, k1)
    sch.blockize(i1)
    assert partial_problem(sch.mod) is None
    built = tvm.compile(sch.mod, target="llvm")
    x, y = (np.random.default_rng(s).random((n, n), dtype="float32") for s in (1, 2))
    out = tvm.runtime.tensor(np.zeros((n, n), dtype="float32"))
    built(tvm.runtime.tensor(x), tvm.runtime.tensor(y), out)
    np.testing.assert_allclose(out.numpy(), x @ y, rtol=1e-4)
