"""TVM MetaSchedule with the team's tuning records: a database on the tunecache server.

Importing :mod:`tunecache` does not import TVM; importing this package does.

Example:
    >>> import tvm
    >>> from tvm.s_tir import meta_schedule as ms
    >>> from tunecache.tvm import Database
    >>> target = {"kind": "llvm", "num-cores": 2}
    >>> db = Database(target=target)  # TUNECACHE_URL, TUNECACHE_TOKEN  # doctest: +SKIP
    >>> sch = ms.tir_integration.compile_tir(db, mod, target)  # doctest: +SKIP
    >>> lib = tvm.tirx.build(sch.mod if sch is not None else mod, target=target)  # doctest: +SKIP

``tunecache tune --tvm FILE.py:NAME`` tunes a module on this machine, validates the best schedule
against the unscheduled module and uploads the validated records to the same database.
"""

from __future__ import annotations

from tunecache.tvm.database import Database
from tunecache.tvm.wire import partition_for, workload_key

__all__ = ["Database", "partition_for", "workload_key"]
