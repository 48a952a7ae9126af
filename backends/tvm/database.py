"""The tuning database, partitioned by target and TVM version.

MetaSchedule's database looks records up by workload alone (it ignores the target) and keys
workloads by a structural hash that only one TVM release reproduces. So each (target, TVM
version) pair gets its own JSON database under ``workdir/<sha(target)>-tvm<version>/``; within
it, re-tuning a workload finds the earlier records and starts from them (warm start).
"""

from __future__ import annotations

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


def open_database(workdir: Path, target: Mapping[str, Any]) -> Database:
    """The JSON database for ``target`` under ``workdir``, created when missing."""
    from tvm.s_tir import meta_schedule as ms

    path = database_dir(workdir, target)
    path.mkdir(parents=True, exist_ok=True)
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
    """Up to ``k`` successfully measured records of ``mod``, fastest first."""
    if not database.has_workload(mod):
        return []
    workload = database.commit_workload(mod)
    records = [r for r in database.get_top_k(workload, k) if mean_seconds(r) is not None]
    records.sort(key=lambda r: mean_seconds(r) or 0.0)
    return records
