"""Process B of ``tests/test_tvm_database.py``: a teammate's fresh process using the team's records.

Usage: ``python tests/tvm_db_client.py URL FILE.py NAME OUT_DIR``

It does what the user's own code would: import ``NAME`` from ``FILE.py``, ask
``compile_tir(tunecache.tvm.Database(URL, target=...), func, target)`` for a schedule, build it
(or the unscheduled function when there is none) and run it on seeded inputs. Every entry point
that could tune or benchmark (``tune_tir``, ``tune_tasks``, the local builder and runner, TVM's
``time_evaluator``) is wrapped with a counter first, so the result says how many ran: zero means
the build used stored records only. Writes ``OUT_DIR/result.json`` and ``OUT_DIR/out.npy``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import runpy
import sys
from collections import Counter
from pathlib import Path
from typing import Any

CALLS: Counter[str] = Counter()


def _count(owner: Any, name: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        CALLS[f"{getattr(owner, '__name__', owner)}.{name}"] += 1
        return original(*args, **kwargs)

    setattr(owner, name, counted)


def _install_counters() -> None:
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule import tir_integration, tune

    for owner, name in [
        (ms, "tune_tir"),
        (tir_integration, "tune_tir"),
        (ms, "tune_tasks"),
        (tune, "tune_tasks"),
        (ms.runner.LocalRunner, "run"),
        (ms.builder.LocalBuilder, "build"),
        (tvm.runtime.Module, "time_evaluator"),
    ]:
        _count(owner, name)


def seeded_inputs(shapes: list[tuple[int, ...]], seed: int = 7) -> list[Any]:
    """Uniform non-zero values in ±[0.1, 1) for every shape (the same in every process)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [
        (rng.uniform(0.1, 1.0, s) * rng.choice([-1.0, 1.0], s)).astype("float32") for s in shapes
    ]


def main(url: str, file: str, name: str, out_dir: str) -> None:
    import numpy as np
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tunecache.tvm import Database
    from tunecache.tvm.target import host_target

    _install_counters()
    func = runpy.run_path(file)[name]
    func = func() if callable(func) and not isinstance(func, tvm.tirx.PrimFunc) else func
    target = host_target()
    database = Database(url, target=target)
    sch = ms.tir_integration.compile_tir(database, func, target)
    mod = sch.mod if sch is not None else ms.tune_context._normalize_mod(func)
    lib = tvm.tirx.build(mod, target=tvm.target.Target(target))
    shapes = [tuple(int(d) for d in p[2]) for p in (a.as_json() for a in _args(mod))]
    values = [*seeded_inputs(shapes[:-1]), np.full(shapes[-1], np.nan, dtype="float32")]
    tensors = [tvm.runtime.tensor(v) for v in values]
    lib["main"](*tensors)
    out = Path(out_dir)
    np.save(out / "out.npy", tensors[-1].numpy())
    result = {
        "schedule": "tuned" if sch is not None else "default",
        "script_sha": hashlib.sha256(mod.script().encode()).hexdigest(),
        "benchmarks": dict(CALLS),
    }
    (out / "result.json").write_text(json.dumps(result))


def _args(mod: Any) -> Any:
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    return ArgInfo.from_entry_func(mod, remove_preproc=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
