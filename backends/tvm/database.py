"""The tuning database, partitioned by target and TVM version.

MetaSchedule's database looks records up by workload alone (it ignores the target) and keys
workloads by a structural hash that only one TVM release reproduces. So each (target, TVM
version) pair gets its own JSON database under ``workdir/<sha(target)>-tvm<version>/``; within
it, re-tuning a workload finds the earlier records and starts from them (warm start).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunecache.tvm.target import partition_name

if TYPE_CHECKING:
    from tvm.ir import IRModule
    from tvm.s_tir.meta_schedule.database import Database, TuningRecord

logger = logging.getLogger(__name__)

# A record whose mean run time is at least this is a failed candidate (MetaSchedule's marker).
_FAILED_SECONDS = 1e9


def database_dir(workdir: Path, target: Mapping[str, Any]) -> Path:
    """The directory holding the database for ``target`` under ``workdir`` (not created)."""
    return Path(workdir) / partition_name(target)


# Past this, a partition's JSON files are not read (MetaSchedule reads them whole into memory at
# every tune): about 2 KB a record, 24 KB a workload, so some hundred thousand trials. A daemon's
# partition grows with every job it runs (a write token queued 500 shapes in two seconds).
MAX_DATABASE_BYTES = 256 * 2**20


def open_database(workdir: Path, target: Mapping[str, Any]) -> Database:
    """The JSON database for ``target`` under ``workdir``, created when missing; an empty one in
    memory (this tune starts cold, warned) when its files hold more than
    :data:`MAX_DATABASE_BYTES`."""
    from tvm.s_tir import meta_schedule as ms

    path = database_dir(workdir, target)
    path.mkdir(parents=True, exist_ok=True)
    size = sum(f.stat().st_size for f in path.glob("*.json") if f.is_file())
    if size > MAX_DATABASE_BYTES:
        logger.warning("MetaSchedule database at %s holds %d MiB (over %d MiB): not read, this "
                       "tune starts cold and its records are not kept; remove the folder to "
                       "start a new one", path, size >> 20, MAX_DATABASE_BYTES >> 20)  # fmt: skip
        return ms.database.MemoryDatabase()
    logger.debug("MetaSchedule database at %s", path)
    return ms.database.JSONDatabase(work_dir=str(path))


def normalize_module(func: Any) -> IRModule:
    """``func`` as the one-function module MetaSchedule tunes (so lookups find its records)."""
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    mod: IRModule = _normalize_mod(func)
    return mod


def mean_seconds(record: TuningRecord) -> float | None:
    """The mean measured run time of ``record``, or ``None`` when it failed or was not run."""
    run_secs = record.run_secs
    if run_secs is None or len(run_secs) == 0:
        return None
    values = [float(v.value if hasattr(v, "value") else v) for v in run_secs]
    mean = sum(values) / len(values)
    return None if mean >= _FAILED_SECONDS else mean


def best_records(database: Database, mod: IRModule, k: int) -> list[TuningRecord]:
    """Up to ``k`` successfully measured records of ``mod``, fastest first, each schedule once
    (its fastest record: a schedule every run proposes again is measured once a run, and
    "validation: 2 of 2 best schedules" were one schedule, twice)."""
    from backends.tvm.schedule import trace_json

    if not database.has_workload(mod):
        return []
    workload = database.commit_workload(mod)
    window = 4 * k
    while True:  # wider until k schedules are found, or the records run out
        top = database.get_top_k(workload, window)
        records = sorted((r for r in top if mean_seconds(r) is not None),
                         key=lambda r: mean_seconds(r) or 0.0)  # fmt: skip
        seen: set[str] = set()
        distinct = []
        for record in records:
            trace = json.dumps(trace_json(record.trace), sort_keys=True)
            if trace not in seen:
                seen.add(trace)
                distinct.append(record)
        if len(distinct) >= k or len(top) < window or window >= MAX_TOP_WINDOW:
            return distinct[:k]
        window *= 4


MAX_TOP_WINDOW = 4096  # records best_records reads at most to find its k schedules
