"""What each rank of ``tests/test_ranks_tvm_inductor.py`` runs, as a user's code would: a
``tunecache.tvm.Database``'s lookups, or ``tunecache.inductor.enable()``; and the TVM records the
test's server answers. ``python -c "import tests.user_ranks_tvm_inductor as m; m.main()"
RANK WORLD INIT URL WHAT`` prints what the rank ended with as one JSON line; ``WORLD`` 1 runs
outside any distributed job."""

from __future__ import annotations

import datetime
import json
import sys
from typing import Any

TARGET = {"kind": "llvm", "num-cores": 1}


def row_sum(n: int) -> Any:
    """A 4-row sum over ``n``: the workload the records are for."""
    from tvm import te
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    a = te.placeholder((4, n), "float32", name="A")
    k = te.reduce_axis((0, n), name="k")
    return _normalize_mod(
        te.create_prim_func([a, te.compute((4,), lambda i: te.sum(a[i, k], axis=k))])
    )


def record_value(mod: Any, factor: int, seconds: float) -> list[Any]:
    """A ``tvm.record`` value the database takes: ``mod``'s reduction split by ``factor``,
    measured at ``seconds``."""
    from tvm.s_tir import Schedule

    from tunecache.tvm.check import args_info_json

    sch = Schedule(mod)
    sch.split(sch.get_loops(sch.get_sblock("compute"))[1], [None, factor])
    trace = json.loads(json.dumps(sch.trace.as_json(), default=lambda o: getattr(o, "value", o)))
    return [trace, [seconds], TARGET, args_info_json(mod)]


def tvm_rank(url: str, steps: list[str]) -> list[Any]:
    """Per step: ``top`` (the best record's seconds and trace, or ``None``) or ``refresh``."""
    from tvm.s_tir.meta_schedule.database import Workload

    from tunecache.tvm import Database
    from tunecache.tvm.wire import mean_seconds

    mod = row_sum(16)
    database = Database(url, target=TARGET, token="", timeout=20)
    done: list[Any] = []
    for step in steps:
        if step == "refresh":
            database.refresh()
            continue
        top = database.get_top_k(Workload(mod), 1)
        done.append([mean_seconds(top[0].run_secs), str(top[0].trace)] if top else None)
    return done


def inductor_rank(url: str, steps: list[str], cache_dir: str) -> list[Any]:
    """Per ``enable`` step: what :func:`tunecache.inductor.enable` fetched, and the groups then
    in this rank's own (empty at first) Inductor choice file."""
    import os

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    import tunecache.inductor as inductor
    from tunecache.inductor.choices import local_cache_path, read_groups

    done: list[Any] = []
    for _ in steps:
        enabled = inductor.enable(url, token="", timeout=20)
        groups = sorted(group.key() for group in read_groups(local_cache_path()))
        done.append({"fetched": enabled.fetched, "groups": groups})
    return done


def main() -> None:
    rank, world, init, url, what = sys.argv[1:6]
    steps = json.loads(sys.argv[6])
    if int(world) > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=init, rank=int(rank), world_size=int(world),
                                timeout=datetime.timedelta(seconds=20))  # fmt: skip
    done = tvm_rank(url, steps) if what == "tvm" else inductor_rank(url, steps, sys.argv[7])
    print(json.dumps(done))
    if int(world) > 1:  # rank 0 holds the store: none leaves while another may still read it
        dist.barrier()
        dist.destroy_process_group()
